"""A domain module whose import fails: its loader must say so, naming the path and the error, without a traceback."""

from commitline import Domain

domain = Domain("raising")
raise RuntimeError("the team's settings file is missing")
