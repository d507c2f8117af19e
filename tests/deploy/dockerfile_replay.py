"""Replay what a Dockerfile copies from its build context, without a Docker daemon.

``replay(dockerfile, context, out)`` reads the Dockerfile's instructions and its
``<Dockerfile>.dockerignore`` (BuildKit's per-Dockerfile ignore file, else the context's
``.dockerignore``) and copies into ``out`` exactly the context files that its build step sees:
the stage's WORKDIR where it runs ``pip wheel``/``pip install`` on ``.``.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass
class Stage:
    base: str
    name: str | None
    workdir: str = "/"
    # (context sources, destination as an absolute path in the image), in order
    copies: list[tuple[list[str], str]] = field(default_factory=list)
    runs: list[tuple[str, str]] = field(default_factory=list)  # (workdir, command)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):  # also inside a continued instruction
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        current = ""
    return out


def exec_form(args: str) -> list[str]:
    """CMD/ENTRYPOINT/COPY arguments: the JSON form, else shell words."""
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def stages(text: str) -> list[Stage]:
    out: list[Stage] = []
    for word, args in instructions(text):
        if word == "FROM":
            parts = args.split()
            out.append(Stage(parts[0], parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None))
        elif word == "WORKDIR":
            out[-1].workdir = str(PurePosixPath(out[-1].workdir) / args)
        elif word in ("COPY", "ADD"):
            words = exec_form(args)
            if any(w.startswith("--from") for w in words):
                continue  # from another stage or image, not the context
            words = [w for w in words if not w.startswith("--")]
            dest = words[-1]
            absolute = str(PurePosixPath(out[-1].workdir) / dest) + ("/" if dest.endswith("/") else "")
            out[-1].copies.append((words[:-1], absolute))
        elif word == "RUN":
            out[-1].runs.append((out[-1].workdir, args))
    return out


def command(text: str) -> list[str]:
    """The last stage's ENTRYPOINT + CMD, as the container runs it."""
    entry, cmd = [], []
    for word, args in instructions(text):
        if word == "FROM":
            entry, cmd = [], []
        elif word == "ENTRYPOINT":
            entry = exec_form(args)
        elif word == "CMD":
            cmd = exec_form(args)
    return entry + cmd


# -- .dockerignore ---------------------------------------------------------------------------
def ignore_patterns(dockerfile: Path, context: Path) -> list[str]:
    own = dockerfile.with_name(dockerfile.name + ".dockerignore")
    path = own if own.is_file() else context / ".dockerignore"
    if not path.is_file():
        return []
    lines = (l.strip() for l in path.read_text().splitlines())
    return [l for l in lines if l and not l.startswith("#")]


def _regex(pattern: str) -> re.Pattern:
    """Go's filepath.Match plus `**` (any number of folders), anchored at the context root."""
    out, i = "", 0
    pattern = str(PurePosixPath(pattern.lstrip("/")))
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "$")


def ignored(relpath: str, patterns: list[str]) -> bool:
    """Whether the context file ``relpath`` is left out: the last matching pattern decides
    (``!`` re-includes), and a pattern matching a folder leaves out everything in it."""
    parts = relpath.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        rx = _regex(pattern[1:] if negate else pattern)
        if any(rx.match(p) for p in prefixes):
            result = not negate
    return result


def context_files(context: Path, patterns: list[str]) -> list[str]:
    """Every file of the build context that the ignore patterns let through."""
    out = []
    # An ignored folder is not walked (.git, .venv), unless a `!` pattern may re-include a file in it.
    prune = not any(p.startswith("!") for p in patterns)
    for folder, dirs, files in os.walk(context):
        rel = Path(folder).relative_to(context).as_posix()
        prefix = "" if rel == "." else rel + "/"
        if prune:
            dirs[:] = [d for d in dirs if not ignored(prefix + d, patterns)]
        out += [prefix + f for f in files if not ignored(prefix + f, patterns)]
    return sorted(out)


# -- the replay ------------------------------------------------------------------------------
PIP_ON_DOT = re.compile(r"\bpip (?:wheel|install)\b[^&;]*\s[\"']?\.(?:\[[^\]]*\])?[\"']?\s")


def build_stage(text: str) -> Stage:
    """The stage that builds the package from context files (`pip wheel .` / `pip install .`)."""
    (stage,) = [s for s in stages(text) if s.copies and any(PIP_ON_DOT.search(cmd + " ") for _, cmd in s.runs)]
    return stage


def replay(dockerfile: Path, context: Path, out: Path) -> Path:
    """Copy into ``out`` what the build stage's WORKDIR holds when it builds the package."""
    stage = build_stage(dockerfile.read_text())
    (workdir,) = {wd for wd, cmd in stage.runs if PIP_ON_DOT.search(cmd + " ")}
    available = context_files(context, ignore_patterns(dockerfile, context))
    image: dict[str, str] = {}  # absolute path in the image -> context file
    for sources, dest in stage.copies:
        for source in sources:
            source = str(PurePosixPath(source))
            inside = [f for f in available if source == "." or f == source or f.startswith(source + "/")]
            assert inside, f"{dockerfile.name}: COPY {source} matches nothing in the context"
            for f in inside:
                if f == source:  # a file: into a folder (dest ends in /) or renamed
                    target = PurePosixPath(dest) / PurePosixPath(f).name if dest.endswith("/") else PurePosixPath(dest)
                else:  # a folder's contents go under dest
                    target = PurePosixPath(dest) / (f if source == "." else f[len(source) + 1:])
                image[str(target)] = f
    out.mkdir(parents=True, exist_ok=True)
    for target, f in image.items():
        rel = PurePosixPath(target).relative_to(workdir) if target.startswith(workdir.rstrip("/") + "/") else None
        if rel is None:
            continue  # copied elsewhere in the image: not what the build step reads
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(context / f, out / rel)
    return out
