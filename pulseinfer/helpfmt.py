"""Help formatting shared by the sub-commands."""

from __future__ import annotations

import argparse

__all__ = ["DefaultsHelpFormatter"]


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, less its noise: ``(default: X)`` is added only where the help text does not
    already say its default and ``X`` says something (not ``None``, ``False`` or an empty list: a flag, or a
    default the text explains)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        says_nothing = default is None or default is False or default == [] or default is argparse.SUPPRESS
        if "default" in text.lower() or says_nothing:  # (identity: a default of 0 still says something)
            return text
        return super()._get_help_string(action) or text
