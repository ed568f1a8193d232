"""The tracer's one error type: a message that names the problem and the fix (the model type
PyTorch's fake tensors or transformers cannot build, the op that reads tensor data, the
optimizer that cannot be traced), raised instead of a traceback from deep inside torch."""


class TraceError(Exception):
    """The program cannot be traced as given; the message says why and what to change."""
