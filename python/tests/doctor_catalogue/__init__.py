"""Training loops for the doctor's catalogue: each `train()` runs under `headroom.tracing` in
the tests; the wrong ones mark the line at fault with a `# MISTAKE` comment."""
