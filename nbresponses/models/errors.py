"""Errors of the model layer: each names what was given and what is accepted."""

from __future__ import annotations


class ModelError(ValueError):
    """Base class: a model could not be resolved, loaded or prepared."""


class ModelSourceError(ModelError):
    """The model source (alias, path, hub id) is unknown, missing, corrupt or unreachable."""


class RecipeError(ModelError):
    """The quantization recipe is unknown or cannot run on this model."""
