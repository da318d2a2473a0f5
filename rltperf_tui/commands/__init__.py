"""Sub-commands of ``rltperf``; each module: HELP, DESCRIPTION, add_arguments, run."""
