"""The grain director's demo."""
