"""Prompt rendering and parsing of generated text for chat-template models."""

from nbresponses.formats.scripted import Script, ScriptedTokenSource

__all__ = ["Script", "ScriptedTokenSource"]
