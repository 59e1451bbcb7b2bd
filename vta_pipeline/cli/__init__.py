"""The command line, `vta-pipeline`: thin commands over the library and the flows, assembled in
`main.py`; every flag that sets a config field comes from one table, `flags.py`."""
