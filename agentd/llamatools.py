"""llama.cpp across nodes: ``llama-server`` and ``ggml-rpc-server``, built with RPC on.

llama-cpp-python's own server cannot spread a model over nodes: its settings
have ``rpc_servers``, but its ``Llama`` class drops the argument (0.3.36). So an
install of llama.cpp also builds llama.cpp's server and RPC server from the
source llama-cpp-python vendors (the very commit its library is built from),
with ``GGML_RPC`` on, and puts them in the engine's environment beside its
Python. A multi-node replica's followers run ``ggml-rpc-server``; its leader
runs ``llama-server --rpc`` (docs/engines.md).

The build needs a C/C++ compiler and takes minutes. cmake comes from PyPI
when the machine has none. A finished build is kept in a cache every agent of
this user shares (``install.build_cache``), keyed by the source archive's digest
and the flags, so a second state dir, a reinstall or a repair copies it.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import tarfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from agentd.steps import pip_for

TOOLS = ("llama-server", "ggml-rpc-server")
# What is built: only the two tools, statically linked (they are copied), with
# nothing fetched at build time (the server's web UI, HTTPS, tests, examples).
FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_RPC=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
DONE = "llmgw-built"

Run = Callable[..., Awaitable[str]]  # agentd.steps.run_step: argv, timeout, what, env -> output


def cache_key(sdist: Path, extra: str) -> str:
    digest = hashlib.sha256()
    with open(sdist, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    digest.update("\0".join((*FLAGS, extra)).encode())
    return digest.hexdigest()[:16]


def built(where: Path) -> bool:
    return (where / DONE).exists() and all((where / "bin" / t).is_file() for t in TOOLS)


async def locked(path: Path):
    """An exclusive lock on ``path`` across processes, polled so a cancel gets through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a")  # noqa: SIM115 - held until the caller closes it
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fh
        except BlockingIOError:
            await asyncio.sleep(1.0)


async def build(
    run: Run,
    env: Path,
    *,
    spec: str,
    pip_args: list[str],
    cmake_args: str,
    cache: Path,
    timeout: float,
    note: Callable[[str], None],
) -> str:
    """Build (or copy from the cache) both tools into ``env/bin``; where they came from."""
    python = str(env / "bin" / "python")
    src = env / "llama.cpp-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    note("downloading llama.cpp's source")
    await run(
        [*pip_for(python), "download", "--disable-pip-version-check", "--no-deps",
         "--no-binary", "llama-cpp-python", "--dest", str(src), spec, *pip_args],
        timeout=timeout, what="pip download (llama.cpp's source)",
    )  # fmt: skip
    archives = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        raise FileNotFoundError(f"pip download left no llama_cpp_python source archive in {src}")
    sdist = archives[0]
    key = cache_key(sdist, cmake_args)
    where = cache / f"llama.cpp-{key}"
    lock = await locked(cache / f"llama.cpp-{key}.lock")
    try:
        if built(where):
            origin = f"from the build cache ({where})"
        else:
            await _compile(run, env, sdist, where, cmake_args, timeout, note)
            origin = f"built ({where})"
    finally:
        lock.close()
    for tool in TOOLS:
        shutil.copy2(where / "bin" / tool, env / "bin" / tool)
    shutil.rmtree(src, ignore_errors=True)
    return origin


async def _compile(
    run: Run,
    env: Path,
    sdist: Path,
    where: Path,
    cmake_args: str,
    timeout: float,
    note: Callable[[str], None],
) -> None:
    work = where.with_name(where.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    await asyncio.to_thread(_extract, sdist, work)
    tree = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if tree is None or not (tree / "CMakeLists.txt").exists():
        raise FileNotFoundError(f"{sdist.name} vendors no llama.cpp tree")
    cmake = shutil.which("cmake")
    if cmake is None:
        note("installing cmake")
        await run(
            [*pip_for(env / "bin" / "python"), "install", "--disable-pip-version-check",
             "cmake"],
            timeout=timeout, what="pip install cmake",
        )  # fmt: skip
        cmake = str(env / "bin" / "cmake")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    note("configuring llama.cpp's server and rpc-server")
    await run(
        [cmake, "-S", str(tree), "-B", str(work / "build"), *generator, *FLAGS,
         *cmake_args.split()],
        timeout=timeout, what="cmake (configure llama.cpp)",
    )  # fmt: skip
    note("compiling llama.cpp's server and rpc-server (minutes)")
    await run(
        [cmake, "--build", str(work / "build"), "--target", *TOOLS,
         "--parallel", str(os.cpu_count() or 1)],
        timeout=timeout, what="cmake --build (llama.cpp)",
    )  # fmt: skip
    shutil.rmtree(where, ignore_errors=True)
    (where / "bin").mkdir(parents=True)
    for tool in TOOLS:
        shutil.copy2(work / "build" / "bin" / tool, where / "bin" / tool)
    (where / DONE).write_text(sdist.name + "\n")
    shutil.rmtree(work, ignore_errors=True)


def _extract(sdist: Path, into: Path) -> None:
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")


async def _run_logged(argv: list[str], *, timeout: float, what: str, log: Path, **_) -> str:
    """``Run`` for the command line: output to ``log``; OSError naming the step if it fails."""
    with open(log, "ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
        try:
            async with asyncio.timeout(timeout):
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            raise OSError(f"{what} took longer than {timeout:g} s (log: {log})") from None
    if code != 0:
        raise OSError(f"{what} exited with {code} (log: {log})")
    return ""


def main(argv: list[str] | None = None) -> int:
    """``python -m agentd.llamatools VENV``: the two tools for a virtualenv that has
    llama-cpp-python already (``make venv`` does this for the local node)."""
    import argparse
    import functools
    import subprocess
    import sys

    ap = argparse.ArgumentParser(prog="python -m agentd.llamatools", description=main.__doc__)
    ap.add_argument("venv", type=Path)
    ap.add_argument("--cache", type=Path, default=None)
    args = ap.parse_args(argv)
    env = args.venv.resolve()
    python = env / "bin" / "python"
    code = "from importlib.metadata import version; print(version('llama-cpp-python'))"
    version = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    cache = args.cache or Path(cache_home) / "llmgw" / "builds"
    log = env / "llama-tools-build.log"
    run = functools.partial(_run_logged, log=log)
    try:
        origin = asyncio.run(
            build(run, env, spec=f"llama-cpp-python=={version}", pip_args=[], cmake_args="",
                  cache=cache, timeout=3600, note=lambda d: print(f"  {d}", flush=True))
        )  # fmt: skip
    except OSError as exc:
        print(f"llama.cpp's llama-server and ggml-rpc-server: {exc}", file=sys.stderr)
        return 1
    print(f"llama.cpp's llama-server and ggml-rpc-server in {env / 'bin'}: {origin}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
