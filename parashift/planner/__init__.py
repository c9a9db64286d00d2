"""The planner: `parashift plan --recommend` and `--simulate`, from the cost model (cost/)."""
