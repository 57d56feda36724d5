"""What-if: the live workload of one model replayed through the calibrated simulator, with
and without each lever of a fix.

``fit`` reads the window from Prometheus, ``replay`` runs the simulator on it, ``calibrate``
fits two speed factors until the replay matches what was measured, ``levers`` turns a lever on
the replayed configuration, ``predict`` puts it together and ``report`` renders it.
"""
