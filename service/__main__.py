"""`python -m service` is the `tensortune` command."""
from .cli import main

main()
