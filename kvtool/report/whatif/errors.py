"""The what-if's refusal: a leaf, so every what-if module can raise it without a cycle."""

from __future__ import annotations

from kvtool.errors import ExitStatus, KvtoolError


class WhatIfRefused(KvtoolError):
    """A pool whose stream cannot support a what-if prediction (exit status 2)."""

    exit_status = ExitStatus.USAGE
