"""diagnose: window -> fetch -> match (onset, shapes) -> rank -> a typed ``Diagnosis``."""

from diagnoser.diagnose.model import Diagnosis, to_json
from diagnoser.diagnose.run import diagnose
from diagnoser.diagnose.window import MIN_STEP, Window

__all__ = ["MIN_STEP", "Diagnosis", "Window", "diagnose", "to_json"]
