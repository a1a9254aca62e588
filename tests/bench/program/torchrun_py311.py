#!/usr/bin/env python3
"""torchrun (torch.distributed.run) with one bug of Debian 12's python3-torch 1.13 worked around, for the launcher
benchmark: under Python 3.11, iterating an IntFlag no longer yields its zero member, so Std.from_str("0") (the
default of --redirects and --tee) returns None and torchrun fails at start ("'NoneType' object has no attribute
'get'" in elastic/multiprocessing/api.py). Nothing else is changed; the arguments are torchrun's."""
import sys

from torch.distributed.elastic.multiprocessing import api

_from_str = api.Std.from_str


def from_str(vm):
    v = _from_str(vm)
    if v is None:  # "0": no redirect, what 1.13 means by its default
        return api.Std.NONE
    if isinstance(v, dict):
        return {k: api.Std.NONE if x is None else x for k, x in v.items()}
    return v


api.Std.from_str = staticmethod(from_str)

from torch.distributed.run import main  # noqa: E402 (after the patch: run reads Std.from_str at parse time)

if __name__ == "__main__":
    sys.exit(main())
