"""vta-pipeline: resumable auto-tuning of convolutional networks with Apache TVM.

The package holds pure, Prefect-free steps over typed configs and artifact paths; the
Prefect tasks and flows that wrap them are `vta_pipeline.tasks` and `vta_pipeline.flows`.

Those two live in the checkout's top-level `tasks/` and `flows/` (the project's shape: the
library, then the thin Prefect edges beside it), and the wheel installs them inside this
package (pyproject's `force-include`), so that an installed vta-pipeline adds no generic
top-level `tasks` or `flows` to a user's environment. In a checkout (an editable install),
this package's path also names the checkout's root, so the same imports find them there.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

_checkout = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "tasks").is_dir() and (_checkout / "tasks" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821 (a package's __path__)
