"""diagnose: window -> fetch -> match (onset, shapes) -> rank -> a typed ``Diagnosis``."""

from diagnoser.diagnosis.model import Diagnosis, to_json
from diagnoser.diagnosis.run import diagnose
from diagnoser.diagnosis.window import MIN_STEP, Window

__all__ = ["MIN_STEP", "Diagnosis", "Window", "diagnose", "to_json"]
