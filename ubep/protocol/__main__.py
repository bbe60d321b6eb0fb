"""``python -m ubep.protocol --write-vectors PATH`` | ``--efficiency-table [HIDDEN]``."""

from __future__ import annotations

import argparse

import torch

from ubep.protocol.efficiency import efficiency_table
from ubep.protocol.vectors import write_vectors


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ubep.protocol", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write-vectors", metavar="PATH", help="write the JSON test vectors to PATH")
    group.add_argument("--efficiency-table", metavar="HIDDEN", type=int, nargs="?", const=7168,
                       help="print the bf16 payload-efficiency table for rows of HIDDEN elements")
    args = parser.parse_args(argv)
    if args.write_vectors:
        write_vectors(args.write_vectors)
    else:
        print(efficiency_table(torch.bfloat16, args.efficiency_table), end="")


if __name__ == "__main__":
    main()
