"""The framework layer: ``Domain`` (what a team declares), the checks a domain passes when it is loaded,
and choosing a domain by ``module:attribute``. Above the engine's layers, below the composition root."""
