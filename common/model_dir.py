"""The model directory a --model value names: a local directory, or a repo id's snapshot in the local Hugging Face
cache (pocserve is offline: vLLM's default of downloading is not ours). Used by the launcher's early check and by
the backend, so both read a value the same way."""

from __future__ import annotations

from pathlib import Path


class ModelNotFound(ValueError):
    """str() is '<model>: why', for a message that names the flag in front."""


def resolve_model(model: str, revision: str | None = None, download_dir: str | None = None) -> Path:
    given = Path(model).expanduser()
    if given.is_dir():
        return given.resolve()
    if given.is_absolute() or model.startswith(".") or model.count("/") != 1:
        raise ModelNotFound(f"{model}: no such directory")
    try:  # the frontend's image has no huggingface_hub; the backend's and the launcher's do
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        raise ModelNotFound(f"{model}: no such directory") from None
    try:
        found = snapshot_download(model, revision=revision, cache_dir=download_dir, local_files_only=True)
    except (HFValidationError, LocalEntryNotFoundError, OSError):
        raise ModelNotFound(f"{model}: no such directory, and not in the local Hugging Face cache (pocserve never "
                            "downloads)") from None
    return Path(found)
