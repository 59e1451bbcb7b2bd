from vta_pipeline.cli.main import app

app(prog_name="vta-pipeline")
