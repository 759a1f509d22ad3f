"""The one exception type for user errors: bad input, bad config, bad files.

The CLI turns a UserError into `tscale <command>: error: <message>` on stderr and exit
code 2, without a traceback unless --debug is given. Library code raises it whenever the
fix is in the user's hands; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem the user can fix: the message names the file, key or value and what to do."""
