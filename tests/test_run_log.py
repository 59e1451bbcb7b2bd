"""A run's full log goes to the store; warnings nobody running the job can act on stay off the console."""

import logging
import warnings

from vta_pipeline.cli.run_log import open_run_log


def test_warnings_go_to_the_run_log_not_the_console(tmp_path, capfd):
    root = logging.getLogger()
    before = list(root.handlers), logging.getLogger("py.warnings").propagate
    try:
        path = open_run_log(tmp_path / "store")
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # pytest's own filters ignore FutureWarning
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning)
        logging.getLogger("vta_pipeline_details").info("task t: 3 candidate(s) kept plain int8 loops")
        logging.getLogger("vta_pipeline.tune").warning("a board under key 'host' did not answer")
        for h in logging.getLogger().handlers + logging.getLogger("py.warnings").handlers:
            h.flush()
        text = path.read_text()
        assert path.parent == tmp_path / "store" / "logs"
        assert "LeafSpec" in text and "kept plain int8 loops" in text and "did not answer" in text
        assert text.count("did not answer") == 1  # each record once, whatever the logger tree
        err = capfd.readouterr().err
        assert "LeafSpec" not in err and "kept plain int8 loops" not in err
    finally:
        for logger in (root, logging.getLogger("py.warnings"), logging.getLogger("vta_pipeline_details")):
            for h in list(logger.handlers):
                if h not in before[0]:
                    logger.removeHandler(h)
                    h.close()
        logging.getLogger("py.warnings").propagate = before[1]
        logging.captureWarnings(False)
