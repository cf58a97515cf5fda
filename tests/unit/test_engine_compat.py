"""Contract test: every private vLLM symbol the project touches exists in the installed vLLM.

Attributes are looked up on the class, or, for instance attributes, in the source of the class (an
assignment `self.<name>` or a parameter/field of that name), so no engine has to be built. Run it on
every supported version (CPU CI covers 0.29; scripts/gpu_check.sh runs it on 0.26).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re

import pytest

from backend.engine import compat

vllm = pytest.importorskip("vllm")


def _source_mentions(obj, name: str) -> bool:
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return False
    return re.search(rf"(self\.{re.escape(name)}\s*[:=])|(\b{re.escape(name)}\s*[:=,)])", source) is not None


@pytest.mark.parametrize(("module", "name", "attrs"), compat.PRIVATE_SYMBOLS,
                         ids=[f"{m}.{n}" for m, n, _ in compat.PRIVATE_SYMBOLS])
def test_engine_compat_private_symbol_exists(module, name, attrs):
    obj = getattr(importlib.import_module(module), name)
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    missing = [a for a in attrs if not (hasattr(obj, a) or a in fields or _source_mentions(obj, a))]
    assert not missing, f"{module}.{name} lacks {missing} in vLLM {vllm.__version__}"


def test_engine_compat_installed_version_is_supported():
    assert vllm.__version__.startswith(compat.SUPPORTED_VERSIONS)
    compat.check_version(vllm.__version__)  # no UnsupportedVersionError


@pytest.mark.parametrize("version", ["0.25.1", "0.30.0", "1.0.0"])
def test_engine_compat_unknown_versions_refuse_to_start(version):
    with pytest.raises(compat.UnsupportedVersionError):
        compat.check_version(version)


def test_a_cpu_share_smaller_than_the_engine_is_refused_with_what_to_give():
    vllm_says = ValueError("Available memory on node 0 (6.05/7.84 GiB) on kv cache allocation is less than requested "
                           "memory for kv (-0.17/0.78 GiB). Reduce CPU memory used by other processes.")
    refusal = compat.cpu_share_too_small(vllm_says)
    assert refusal is not None and "0.78 GiB" in refusal and "--kv-cache-memory-bytes" in refusal
    # Short of free memory with a positive share: vLLM's own advice stands.
    assert compat.cpu_share_too_small(ValueError("... less than requested memory for kv (2.10/3.00 GiB) ...")) is None
    assert compat.cpu_share_too_small(ValueError("something else")) is None
