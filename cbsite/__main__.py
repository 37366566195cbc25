from cbsite.cli import run

run()
