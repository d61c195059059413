"""The package without its optional frameworks: ``import gdn`` needs NumPy alone, and
``import gdn.jax`` / ``import gdn.torch`` without JAX / PyTorch (or a build without the JAX
handlers) raise an ImportError that says what to install. Each case runs in a fresh Python in
which the framework is made uninstalled by a meta-path finder (the test environment has both)."""

import subprocess
import sys
import textwrap

import pytest

# Makes the named packages look uninstalled: importing them (or a submodule) raises what Python
# raises for a missing package.
BLOCK = textwrap.dedent("""
    import sys
    BLOCKED = {blocked!r}

    class Uninstalled:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, Uninstalled())
""")


def run(blocked, code):
    script = BLOCK.format(blocked=tuple(blocked)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)


def test_import_gdn_needs_neither_framework():
    r = run(["jax", "jaxlib", "torch"], """
        import gdn
        print(gdn.__version__, gdn.cpu_isa(), gdn.default_threads() >= 1)
        assert "jax" not in sys.modules and "torch" not in sys.modules
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[2] == "True"


@pytest.mark.parametrize("framework, extra, blocked", [
    ("jax", "'.[jax]'", ["jax", "jaxlib"]),
    ("torch", "'.[torch]'", ["torch"]),
])
def test_framework_missing_names_the_extra(framework, extra, blocked):
    r = run(blocked, f"""
        try:
            import gdn.{framework}
        except ImportError as e:
            print(type(e).__name__ + ": " + str(e))
            print("cause:", type(e.__cause__).__name__, e.__cause__.name)
        else:
            raise SystemExit("gdn.{framework} imported without {framework}")
    """)
    assert r.returncode == 0, r.stderr
    first, cause = r.stdout.splitlines()
    assert first.startswith(f"ImportError: gdn.{framework} needs "), first
    assert f"pip install {extra}" in first, first
    # The framework's own error is kept as the cause.
    assert cause == f"cause: ModuleNotFoundError {blocked[0]}", cause


def test_missing_module_inside_the_framework_is_not_reworded():
    # JAX installed but broken (a dependency of its own missing): its own error, not the advice.
    r = run(["ml_dtypes"], """
        import gdn.jax
    """)
    assert r.returncode != 0
    assert "No module named 'ml_dtypes'" in r.stderr, r.stderr[-2000:]
    assert "jax extra" not in r.stderr


def test_build_without_jax_handlers_says_so():
    # What a GDN_JAX=OFF build's extension reports (pyproject.toml), with JAX installed.
    r = run([], """
        from gdn import _gdn
        assert _gdn.has_xla_ffi is True  # this build has them
        _gdn.has_xla_ffi = False
        try:
            import gdn.jax
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("gdn.jax imported without handlers")
    """)
    assert r.returncode == 0, r.stderr
    assert "this build of gdn has no JAX handlers (built with GDN_JAX=OFF" in r.stdout, r.stdout
    assert "pip install '.[jax]'" in r.stdout


REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("gdn_jax, with_jax", [(None, True), ("OFF", False), ("0", False),
                                               ("ON", True)])
def test_jaxlib_is_a_build_requirement_unless_gdn_jax_is_off(gdn_jax, with_jax):
    # What pip's isolated build installs and what CMake is told, as scikit-build-core reads
    # pyproject.toml (a torch-only build needs no jaxlib: docs/dependencies.md).
    pytest.importorskip("scikit_build_core")
    import tomllib
    static = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    assert not any(r.startswith("jaxlib") for r in static), static
    code = textwrap.dedent("""
        from scikit_build_core.build import get_requires_for_build_wheel
        from scikit_build_core.settings.skbuild_read_settings import SettingsReader
        print(get_requires_for_build_wheel())
        print(dict(SettingsReader.from_file("pyproject.toml").settings.cmake.define))
    """)
    env = {k: v for k, v in __import__("os").environ.items() if k != "GDN_JAX"}
    if gdn_jax is not None:
        env["GDN_JAX"] = gdn_jax
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    requires, defines = [eval(line) for line in r.stdout.splitlines()[-2:]]
    assert any(q.startswith("jaxlib>=") for q in requires) == with_jax, requires
    assert defines["GDN_JAX"] == ("ON" if with_jax else "OFF"), defines
    # The override changes GDN_JAX alone.
    assert defines["GDN_BUILD_PYTHON"] == "ON" and defines["GDN_INSTALL"] == "OFF", defines
