"""t5x_like: BERT, GPT and T5 in JAX/Flax.

Importing the package applies `host_runtime`'s process-wide CPU settings (XLA's CPU fusion
flag, glibc keeping freed memory for the next step but handing back what a compile freed) in a
process that will run on the CPU (T5X_LIKE_CPU_TUNING=off leaves them out); they must precede
jax's backend start, which every entry point here ensures by importing the
package first. It also quiets the libraries' start-up notices that do not concern the user
(`host_runtime.quiet_library_logs`), which must precede TensorFlow's import.
"""

from t5x_like import host_runtime as _host_runtime

_host_runtime.apply_cpu_process_settings()
_host_runtime.quiet_library_logs()
