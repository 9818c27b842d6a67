"""Hard limits every service enforces the same way (requests beyond them are INVALID_ARGUMENT)."""

MAX_SPECULATIVE_TOKENS = 16  # gamma; the paper uses 6
MAX_NEW_TOKENS = 8192
MAX_PROMPT_CHARS = 1_000_000
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256

# model dtypes a service accepts (calispec_core.modeling checks the same list; kept here, free of
# torch and of the serving extras, so light command-line parsers can offer it)
DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16", "int8"]
# how float32 Linear layers multiply on CPU: "onednn" sends multi-row products (the verify forward) to
# oneDNN, whose cost stays flat in rows where MKL's SGEMM grows ~linearly on some CPUs
# (calispec_core/onednn_linear.py); "default" keeps torch's own path. Other dtypes ignore it.
FP32_LINEAR_CHOICES = ("onednn", "default")
