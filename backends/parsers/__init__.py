"""Pure parsers of the engines' own texts (metrics, slots, props, model lists, usage).

Each takes what the engine sent (bytes, text or decoded JSON) and returns a frozen value; none
does I/O, so each is unit-tested on recorded responses.
"""
