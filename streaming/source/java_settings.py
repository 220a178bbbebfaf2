"""The Java Kafka client's settings that every other client's translation reads.

The service's `kafka` settings are the Java client's (Spark's source takes them as `kafka.<key>`).
streaming/source/admin.py turns them into kafka-python's settings and streaming/source/options.py
into librdkafka's; both read the TLS settings and the JAAS login from here. This module imports no
Kafka client: the Python source's planner process starts with it on every query start.
"""

from __future__ import annotations

import re

# The security.protocol values under which the Java client reads its TLS and its SASL settings.
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
# The JAAS login modules that log in with a username and password (sasl.mechanism PLAIN, SCRAM-*).
PASSWORD_LOGIN_MODULES = ("plain.PlainLoginModule", "scram.ScramLoginModule")

# The Java client's TLS settings, read by each translation to another client's settings.
JAVA_TLS_SETTINGS = frozenset(
    {
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.certificates",
        "ssl.truststore.password",
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
    }
)

# A JAAS configuration as the Java client parses it (java.io.StreamTokenizer): words, quoted
# strings with backslash escapes, '=' and ';'.
_JAAS_TOKEN = re.compile(
    r"""\s*(?:
      (?P<word>[A-Za-z_$\-\x80-\uffff][\w.$\-\x80-\uffff]*)
    | (?P<quoted>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<punct>[=;])
    )""",
    re.VERBOSE | re.DOTALL,
)
_JAAS_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_JAAS_FLAGS = ("required", "requisite", "sufficient", "optional")


def parse_jaas(jaas: str) -> tuple[str, dict[str, str]]:
    tokens = _jaas_tokens(jaas)

    def take(kind: str, what: str) -> str:
        if not tokens or tokens[0][0] != kind:
            # Words and quoted values are not shown: one may be the password.
            found = (
                "the end"
                if not tokens
                else repr(tokens[0][1])
                if tokens[0][0] == "punct"
                else "a word"
                if tokens[0][0] == "word"
                else "a quoted value"
            )
            raise ValueError(f"kafka option sasl.jaas.config: expected {what}, found {found}")
        return tokens.pop(0)[1]

    module = take("word", "a login module class")
    flag = take("word", f"a control flag ({', '.join(_JAAS_FLAGS)}) after {module}")
    if flag.lower() not in _JAAS_FLAGS:
        raise ValueError(
            f"kafka option sasl.jaas.config: the word after {module} is not a control flag ({', '.join(_JAAS_FLAGS)})"
        )
    options: dict[str, str] = {}
    while tokens and tokens[0] != ("punct", ";"):
        name = take("word", "an option name or ';'")
        take("punct", f"'=' after {name}")
        if tokens and tokens[0][0] in ("word", "quoted"):
            options[name] = tokens.pop(0)[1]
        else:
            take("quoted", f"a value for {name}")
    take("punct", "';' at the end of the login module")
    if tokens:
        raise ValueError(
            f"kafka option sasl.jaas.config: a client takes exactly one login module, found more after {module}"
        )
    return module, options


def _jaas_tokens(jaas: str) -> list[tuple[str, str]]:
    tokens = []
    position = 0
    while jaas[position:].strip():
        match = _JAAS_TOKEN.match(jaas, position)
        if match is None:
            # Only the position: the text may hold the password.
            raise ValueError(
                f"kafka option sasl.jaas.config: unexpected character at position "
                f"{len(jaas) - len(jaas[position:].lstrip()) + 1}"
            )
        kind = match.lastgroup or ""
        text = match.group(kind)
        tokens.append((kind, _unquote(text) if kind == "quoted" else text))
        position = match.end()
    return tokens


def _unquote(quoted: str) -> str:
    body, out, i = quoted[1:-1], [], 0
    while i < len(body):
        char = body[i]
        i += 1
        if char != "\\":
            out.append(char)
            continue
        char = body[i]
        i += 1
        if char in "01234567":  # octal, up to \377 as in Java
            digits = char
            while i < len(body) and len(digits) < (3 if digits[0] <= "3" else 2) and body[i] in "01234567":
                digits += body[i]
                i += 1
            out.append(chr(int(digits, 8)))
        else:
            out.append(_JAAS_ESCAPES.get(char, char))
    return "".join(out)
