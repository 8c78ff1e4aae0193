"""What `pip install .` puts in a user's site-packages: one top-level package, `dupalign`,
with the JSON Schemas inside it and the `dupalign` console script."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_one_top_level_package_with_its_schemas(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True,
                   timeout=300)
    (wheel,) = tmp_path.glob("dupalign-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"dupalign"}
    schemas = {Path(n).name for n in names if n.startswith("dupalign/wire/schemas/")}
    shipped = {p.name for p in (ROOT / "dupalign" / "wire" / "schemas").rglob("*.json")}
    assert shipped and schemas == shipped
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "dupalign = dupalign.service.cli:main" in text
