"""Byte units, one home: every size fp8probe reports or compares is in bytes and printed in GiB."""

from __future__ import annotations

GiB = 1 << 30
