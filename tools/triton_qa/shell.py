"""The few shell verbs Triton's test.sh files use to build a repository, as methods.

Paths are relative to the folder test.sh runs in, as in the script, so a suite reads like
its test.sh: `d.mkdir("models/x/1")`, `d.cp("../../python_models/x/model.py",
"models/x/1/")`, `d.sed("models/x/config.pbtxt", r"^name:.*", 'name: "x"')`.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
from pathlib import Path


class Dir:
    def __init__(self, path: Path, *, root: Path, backend_repo: Path | None) -> None:
        self.path = path
        self.root = root
        self.backend_repo = backend_repo

    def p(self, rel: str) -> Path:
        return (self.path / rel).resolve() if not rel.startswith("/") else Path(rel)

    def mkdir(self, *rels: str) -> None:
        """mkdir -p"""
        for rel in rels:
            self.p(rel).mkdir(parents=True, exist_ok=True)

    def rm(self, *rels: str) -> None:
        """rm -rf (globs allowed)"""
        for rel in rels:
            for hit in glob.glob(str(self.p(rel))):
                path = Path(hit)
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()

    def cp(self, src: str, dst: str) -> None:
        """cp -r SRC DST: into DST when it is a folder (or ends with /), else as DST."""
        sources = sorted(glob.glob(str(self.p(src)))) or [str(self.p(src))]
        for one in sources:
            source = Path(one)
            target = self.p(dst)
            if target.is_dir() or dst.endswith("/"):
                target = target / source.name
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)

    def mv(self, src: str, dst: str) -> None:
        shutil.move(self.p(src), self.p(dst))

    def sed(self, rel: str, pattern: str, repl: str, *, every: bool = False) -> None:
        """sed -i "s/PATTERN/REPL/[g]" on each line (PATTERN as a Python regex)."""
        path = self.p(rel)
        lines = path.read_text().split("\n")
        regex = re.compile(pattern)
        out = [
            regex.sub(repl.replace("\\", "\\\\"), line, count=0 if every else 1) for line in lines
        ]
        path.write_text("\n".join(out))

    def append(self, rel: str, text: str) -> None:
        """echo "TEXT" >> FILE"""
        with self.p(rel).open("a") as f:
            f.write(text + "\n")

    def model(self, name: str, src: str, *, files: tuple[str, ...] = ("model.py",)) -> None:
        """The usual three lines: mkdir -p models/NAME/1; cp SRC/FILES models/NAME/1/;
        cp SRC/config.pbtxt models/NAME/."""
        self.mkdir(f"models/{name}/1")
        for file in files:
            self.cp(f"{src}/{file}", f"models/{name}/1/")
        self.cp(f"{src}/config.pbtxt", f"models/{name}/")

    def clone_python_backend(self) -> None:
        """git clone .../python_backend (test.sh's clone), from the mirror on disk."""
        if self.backend_repo is None:
            raise RuntimeError("this suite needs --backend-repo (python_backend's git mirror)")
        target = self.p("python_backend")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        archive = subprocess.run(
            ["git", f"--git-dir={self.backend_repo}", "archive", "HEAD"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
