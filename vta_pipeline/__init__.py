"""vta-pipeline: resumable auto-tuning of convolutional networks with Apache TVM.

The package holds pure, Prefect-free steps over typed configs and artifact paths; the
Prefect tasks (`tasks/`) and flows (`flows/`) wrap them.
"""

__version__ = "0.1.0"
