"""The subcommands of `met`; each module registers its parser and the function that runs it."""

from met.commands import bench, chat, doctor, models, run, serve, top, trace

COMMANDS = [serve, run, chat, bench, models, doctor, trace, top]
