"""overlap-harness: the command line that wires scenarios, the protocol model and devices."""
