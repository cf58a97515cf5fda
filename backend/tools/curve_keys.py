"""The former name of `python -m common.curve_keys` (common/curve_keys.py), kept for operators' scripts."""

from common.curve_keys import create_key_pair, main

__all__ = ["create_key_pair", "main"]

if __name__ == "__main__":
    main()
