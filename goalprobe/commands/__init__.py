"""CLI subcommands: one module per verb; heavy imports happen inside the command function."""
