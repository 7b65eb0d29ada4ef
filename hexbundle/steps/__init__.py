"""The build steps (inputs, convert, compile, bundle), the step runner and its executors."""
