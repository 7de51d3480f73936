#!/usr/bin/env python3
"""The release's chart: its default image points at the pushed reference.

``python3 tools/release/chart.py CHART_DIR --repository REPO``
    sets ``image.repository`` in CHART_DIR/values.yaml (a copy of helm/agentrun-operator) to REPO,
    editing that one line so the file's comments (the chart's documented defaults) are kept;
    ``image.tag`` stays empty: the tag is the chart's appVersion, which ``helm package
    --app-version VERSION`` sets, so the packaged chart's default image is REPO:VERSION.
``python3 tools/release/chart.py --check CHART.tgz --repository REPO --version VERSION``
    fails unless the packaged chart says version VERSION, appVersion VERSION, image.repository
    REPO and an empty image.tag.
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

import yaml

LINE = re.compile(r"^(image:\n(?:[ ]+.*\n|\s*#.*\n)*?[ ]+repository:[ ]*)(\S+)(.*)$", re.MULTILINE)


def set_repository(values_text: str, repository: str) -> str:
    m = LINE.search(values_text)
    if m is None:
        raise SystemExit("tools/release/chart.py: no image.repository line in values.yaml")
    out = values_text[:m.start(2)] + repository + values_text[m.end(2):]
    doc = yaml.safe_load(out)
    if doc["image"]["repository"] != repository:  # the edit hit something else
        raise SystemExit(f"tools/release/chart.py: image.repository is {doc['image']['repository']!r} after the edit")
    return out


def check(tgz: str, repository: str, version: str) -> list[str]:
    with tarfile.open(tgz) as tf:
        def read(name: str) -> dict:
            f = tf.extractfile(next(m for m in tf.getmembers() if m.name.split("/", 1)[-1] == name
                                    and m.name.count("/") == 1))
            return yaml.safe_load(f.read()) if f else {}
        chart, values = read("Chart.yaml"), read("values.yaml")
    errors = []
    if str(chart.get("version")) != version or str(chart.get("appVersion")) != version:
        errors.append(f"Chart.yaml has version {chart.get('version')!r}, appVersion {chart.get('appVersion')!r}")
    image = values.get("image") or {}
    if image.get("repository") != repository:
        errors.append(f"values.yaml has image.repository {image.get('repository')!r}")
    if image.get("tag"):
        errors.append(f"values.yaml has image.tag {image.get('tag')!r}: the tag must be the appVersion")
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/release/chart.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="the chart directory to edit, or with --check the packaged chart")
    ap.add_argument("--repository", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--version")
    a = ap.parse_args(argv)
    if a.check:
        errors = check(a.path, a.repository, a.version or "")
        for e in errors:
            print(f"tools/release/chart.py: {a.path}: {e}", file=sys.stderr)
        return 1 if errors else 0
    values = Path(a.path) / "values.yaml"
    values.write_text(set_repository(values.read_text(), a.repository))
    return 0


if __name__ == "__main__":
    sys.exit(main())
