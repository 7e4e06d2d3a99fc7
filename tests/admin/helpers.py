"""The admin's forms as a browser would post them back."""

from html.parser import HTMLParser


class _FormScraper(HTMLParser):
    """What a browser would submit for the page's main form."""

    def __init__(self):
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._textarea = None
        self._select = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("submit", "button", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            # A checked box without a value posts "on"; an empty input posts "".
            default = "on" if kind in ("checkbox", "radio") else ""
            self.data.setdefault(name, []).append(a.get("value", default))
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = [""]
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.data.setdefault(self._select, []).append(a.get("value", ""))

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea][0] += data


def form_data(html: str) -> dict:
    """The fields a browser would post back for an admin form, as the test client takes them."""
    scraper = _FormScraper()
    scraper.feed(html)
    return {k: (v if len(v) > 1 else v[0]) for k, v in scraper.data.items()}
