"""What the engine sends a rank each step and what it needs to build it: the message
(`message.py`), the engine's record of what the ranks know (`encoder.py`) and the
binary layout it travels in (`codec.py`). Both sides import it; it imports neither."""
