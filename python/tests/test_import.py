"""`import headroom` and the planner work in a Python without torch (simulated by an import
hook that refuses torch in a fresh interpreter); the tracer then says how to install it."""

import json
import subprocess
import sys
import textwrap

NO_TORCH = textwrap.dedent(
    """
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NoTorch())
    """
)


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_blocker_really_blocks_torch():
    out = run("import torch")
    assert out.returncode != 0 and "No module named 'torch'" in out.stderr


def test_import_and_plan_without_torch(gpt2_config):
    out = run(
        f"""
        import json, headroom
        assert "torch" not in sys.modules
        report = headroom.plan(model={str(gpt2_config)!r}, gpu="h100-80gb", seq_len=128,
                               micro_batch=2, accumulation=1)
        assert "torch" not in sys.modules
        print(json.dumps(sorted(report)))
        """
    )
    assert out.returncode == 0, out.stderr
    keys = json.loads(out.stdout)
    assert "recommended" in keys or "plans" in keys, keys


def test_trace_without_torch_names_the_install_command(gpt2_config):
    out = run(
        f"""
        import headroom
        try:
            headroom.trace({str(gpt2_config)!r}, seq_len=8)
        except headroom.TraceError as e:
            print(e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "pip install torch transformers" in out.stdout, out.stdout


def test_tracing_without_torch_names_a_bad_device_then_the_install_command():
    # The device is checked without torch; entering the block then says how to install it.
    out = run(
        """
        import headroom
        try:
            headroom.tracing(device="tpu")
        except headroom.TraceError as e:
            print("device:", e)
        try:
            with headroom.tracing():
                pass
        except headroom.TraceError as e:
            print("torch:", e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "device: unknown device 'tpu'; accepted: cuda, cpu" in out.stdout, out.stdout
    assert "torch:" in out.stdout and "pip install torch" in out.stdout, out.stdout
