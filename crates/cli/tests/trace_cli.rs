//! `headroom trace` without a usable Python: one clear line naming the interpreter and the fix.
//! (The traced path itself runs Python and is tested in python/tests/test_trace_cli.py.)

use std::process::Command;

#[test]
fn a_missing_interpreter_names_headroom_python() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("no-such-python");
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["trace", "config.json", "--seq-len", "8"])
        .env("HEADROOM_PYTHON", &python)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot run Python '{}'", python.display()))
            && err.contains("set HEADROOM_PYTHON"),
        "{err}"
    );
}

#[test]
fn an_interpreter_without_the_tracer_names_the_install_command() {
    // `sh -c` stands in for a Python that cannot import headroom: it exits 1 with a message.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("python");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'headroom'\" >&2\nexit 1\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["trace", "config.json", "--seq-len", "8"])
        .env("HEADROOM_PYTHON", &fake)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "cannot import headroom's tracer (ModuleNotFoundError: No module named 'headroom')"
        ) && err.contains("-m pip install headroom-mem torch transformers"),
        "{err}"
    );
}

/// A stand-in interpreter: it imports anything (`-c`), and as the tracer writes its arguments
/// to `args.txt` beside itself and a one-allocation trace to `--output`.
#[cfg(unix)]
fn recording_python(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let fake = dir.join("python");
    let script = format!(
        "#!/bin/sh\n[ \"$1\" = \"-c\" ] && exit 0\necho \"$@\" > '{}'\nprev=''\nfor a in \"$@\"; do [ \"$prev\" = --output ] && out=\"$a\"; prev=\"$a\"; done\necho '[{{\"action\": \"alloc\", \"addr\": 1, \"size\": 512}}]' > \"$out\"\n",
        dir.join("args.txt").display()
    );
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake
}

#[cfg(unix)]
#[test]
fn the_device_and_the_cuda_arch_reach_the_tracer() {
    let dir = tempfile::tempdir().unwrap();
    let fake = recording_python(dir.path());
    let trace = dir.path().join("t.json");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(["trace", "config.json", "--seq-len", "8", "--json", "-o"])
            .arg(&trace)
            .args(extra)
            .env("HEADROOM_PYTHON", &fake)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(dir.path().join("args.txt")).unwrap()
    };
    // The defaults: CUDA's kernels, sized for Hopper.
    let args = run(&[]);
    assert!(args.contains("--device cuda --cuda-arch sm90"), "{args}");
    let args = run(&["--device", "cpu", "--cuda-arch", "sm80"]);
    assert!(args.contains("--device cpu --cuda-arch sm80"), "{args}");
}
