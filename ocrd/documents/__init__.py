"""Documents: one claimed job's life from its pages to its settlement. The state machine
(`document`), admission and dispatch (`dispatch`), the pages flowing through rendering and
the engine (`pipeline`, `sources`, `schedule`), and the rules for failures and crashes
(`failures`, `crashes`); `convert` and `rerender` run the same steps as commands."""
