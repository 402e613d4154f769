"""Read models built by followers of the notification log, never by the command path.

``PROJECTIONS`` names every projection; ``ReadModels`` queries them; ``Projector`` keeps one
up to date; ``rebuild`` replaces one with a fresh build from the first event.
"""

from commitline.projections.queries import ReadModels
from commitline.projections.read_models import PROJECTIONS

__all__ = ["PROJECTIONS", "ReadModels"]
