from fedtune.cli import app

app()
