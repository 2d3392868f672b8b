"""Local stand-ins for outside services (a provider's HTTP API, SMTP, Slack, an OpenAI-style
model), served on 127.0.0.1 from a thread of the pytest process so worker processes can call
them with real clients. Fixtures are in `tests.stubs.fixtures`."""

from .model import ModelStub
from .provider import ProviderStub
from .slack import SlackStub
from .smtp import SmtpMessage, SmtpStub
from .tarpit import Tarpit

__all__ = ["ModelStub", "ProviderStub", "SlackStub", "SmtpMessage", "SmtpStub", "Tarpit"]
