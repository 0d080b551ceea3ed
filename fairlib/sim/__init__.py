"""The compiled engine model: state arrays, waiting lines and the iteration loop."""
