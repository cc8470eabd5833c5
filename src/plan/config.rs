//! HAProxy configuration text as structure: sections, their directives as words, and server
//! lines with the attributes the Runtime API can change picked out. Just enough of HAProxy's
//! syntax to compare two configurations; HAProxy itself remains the judge of validity.

/// Keywords that open a section.
pub(crate) const SECTION_KEYWORDS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "userlist",
    "peers",
    "resolvers",
    "cache",
    "program",
    "http-errors",
    "ring",
    "log-forward",
    "mailers",
    "crt-store",
    "traces",
    "acme",
];

/// One section: its header words and its directives, servers apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// `backend app` → `["backend", "app"]`.
    pub header: Vec<String>,
    /// Every directive but `server` lines, in order, as words.
    pub directives: Vec<Vec<String>>,
    /// The `server` lines, in order.
    pub servers: Vec<Server>,
}

/// A `server` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// Its name.
    pub name: String,
    /// Its address, without the port.
    pub address: String,
    /// Its port, if given.
    pub port: Option<String>,
    /// `weight N`, if given.
    pub weight: Option<String>,
    /// Whether it starts disabled (`disabled`).
    pub disabled: bool,
    /// Every other word, in order: changing any of these needs a reload.
    pub rest: Vec<String>,
}

/// A whole configuration.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ParsedConfig {
    /// Directives before any section (rare, but HAProxy allows comments and blank lines only).
    pub preamble: Vec<Vec<String>>,
    /// The sections, in order.
    pub sections: Vec<Section>,
}

/// Splits one line into words the way HAProxy does for comparison purposes: whitespace
/// separates words, quotes group, a backslash escapes, `#` outside quotes starts a comment.
pub fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '#') => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
                current.push(c);
            }
            (Some(q), c) if c == q => {
                quote = None;
                current.push(c);
            }
            (Some('\''), c) => current.push(c),
            (_, '\\') => {
                in_word = true;
                current.push('\\');
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            (_, c) => {
                in_word = true;
                current.push(c);
            }
        }
    }
    if in_word {
        words.push(current);
    }
    words
}

/// Parses a configuration into sections and directives.
pub fn parse(text: &str) -> ParsedConfig {
    let mut config = ParsedConfig::default();
    for line in text.lines() {
        let words = words(line);
        let Some(first) = words.first() else { continue };
        if SECTION_KEYWORDS.contains(&first.as_str()) {
            config.sections.push(Section { header: words, directives: Vec::new(), servers: Vec::new() });
            continue;
        }
        match config.sections.last_mut() {
            Some(section) if first == "server" && words.len() >= 3 => section.servers.push(server(&words)),
            Some(section) => section.directives.push(words),
            None => config.preamble.push(words),
        }
    }
    config
}

/// A configuration's text cut at its section headers, nothing else parsed: the planner parses
/// only the sections whose text differs (at 10,000 backends a whole parse of both sides was
/// about 50 MB and most of a plan's time, for a change to one section).
#[derive(Debug)]
pub struct SectionTexts<'a> {
    /// The lines before the first section.
    pub preamble: &'a str,
    /// Each section from its header line to the next one.
    pub sections: Vec<SectionText<'a>>,
}

/// One section's text. Its header is split into words only when asked: a plan matches the
/// sections of two configurations by header, and at 10,000 backends splitting every header of
/// both (for each pod at each render) was most of the controller's planning time, though two
/// equal header lines need no splitting to match.
#[derive(Debug)]
pub struct SectionText<'a> {
    /// The header line, as it is.
    pub header_line: &'a str,
    /// The header line and every line up to the next section's.
    pub text: &'a str,
}

impl SectionText<'_> {
    /// `backend app` → `["backend", "app"]`, as [`parse`] gives it.
    pub fn header(&self) -> Vec<String> {
        words(self.header_line)
    }

    /// Whether two sections have the same header (the same words, however spaced).
    pub fn same_header(&self, other: &SectionText<'_>) -> bool {
        self.header_line == other.header_line || self.header() == other.header()
    }

    /// The section parsed, as [`parse`] would give it within the whole configuration.
    pub fn parse(&self) -> Section {
        let mut parsed = parse(self.text).sections;
        match parsed.len() {
            1 => parsed.remove(0),
            // Cannot happen: the text starts at a header and holds no other.
            _ => Section { header: self.header(), directives: Vec::new(), servers: Vec::new() },
        }
    }

    /// The section's first word (`backend`, `defaults`, ...): the keyword it was cut at.
    pub fn kind(&self) -> &str {
        first_word(self.header_line)
    }
}

/// The bytes some section keyword starts with.
const KEYWORD_INITIALS: [bool; 256] = {
    let mut initials = [false; 256];
    let mut at = 0;
    while at < SECTION_KEYWORDS.len() {
        initials[SECTION_KEYWORDS[at].as_bytes()[0] as usize] = true;
        at += 1;
    }
    initials
};

/// Cuts a configuration at the lines [`parse`] starts a section with.
pub fn split_sections(text: &str) -> SectionTexts<'_> {
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        // Most lines are servers and directives, most of them starting with a letter no
        // section keyword starts with (`server`, `option`): that rules them out at once.
        let initial = line.trim_start().as_bytes().first().copied().unwrap_or_default();
        if KEYWORD_INITIALS[usize::from(initial)] && SECTION_KEYWORDS.contains(&first_word(line)) {
            starts.push(offset);
        }
        offset += line.len();
    }
    let preamble = &text[..starts.first().copied().unwrap_or(text.len())];
    let sections = starts
        .iter()
        .enumerate()
        .map(|(i, &start)| {
            let end = starts.get(i + 1).copied().unwrap_or(text.len());
            let text = &text[start..end];
            SectionText { header_line: text.lines().next().unwrap_or_default(), text }
        })
        .collect();
    SectionTexts { preamble, sections }
}

/// A line's first word when it is a plain one (what [`words`] would give, for a word without
/// quotes or escapes: up to whitespace or a comment); anything else gives a word no keyword is.
pub fn first_word(line: &str) -> &str {
    let line = line.trim_start();
    let end = line.find(|c: char| c.is_whitespace() || c == '#').unwrap_or(line.len());
    &line[..end]
}

fn server(words: &[String]) -> Server {
    let (address, port) = split_address(&words[2]);
    let mut server = Server { name: words[1].clone(), address, port, weight: None, disabled: false, rest: Vec::new() };
    let mut i = 3;
    while i < words.len() {
        match words[i].as_str() {
            "weight" if i + 1 < words.len() => {
                server.weight = Some(words[i + 1].clone());
                i += 2;
                continue;
            }
            "disabled" => server.disabled = true,
            // `enabled` is the default; it changes nothing the runtime state would not.
            "enabled" => {}
            other => server.rest.push(other.to_owned()),
        }
        i += 1;
    }
    server
}

/// `10.0.0.1:80` → (`10.0.0.1`, `80`); `[fd00::1]:80` → (`fd00::1`, `80`); no port → `None`.
fn split_address(text: &str) -> (String, Option<String>) {
    if let Some(rest) = text.strip_prefix('[')
        && let Some((host, after)) = rest.split_once(']')
    {
        return (host.to_owned(), after.strip_prefix(':').map(str::to_owned));
    }
    // More than one colon without brackets is a bare IPv6 address.
    if text.matches(':').count() == 1
        && let Some((host, port)) = text.split_once(':')
    {
        return (host.to_owned(), Some(port.to_owned()));
    }
    (text.to_owned(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_follow_quotes_escapes_and_comments() {
        assert_eq!(words("  bind :80   # public"), ["bind", ":80"]);
        assert_eq!(words(r#"http-request return string "a # b""#), ["http-request", "return", "string", "\"a # b\""]);
        assert_eq!(words(r"log-format %t\ %s"), ["log-format", r"%t\ %s"]);
        assert_eq!(words("  # only a comment"), Vec::<String>::new());
    }

    #[test]
    fn sections_directives_and_servers_are_separated() {
        let config = parse(
            "# _version=3\nglobal\n    maxconn 100\n\nbackend app\n    balance roundrobin\n    \
             server s1 10.0.0.1:8080 weight 10 check\n    server s2 [fd00::2]:80 disabled\n",
        );
        assert_eq!(config.sections.len(), 2);
        let app = &config.sections[1];
        assert_eq!(app.header, ["backend", "app"]);
        assert_eq!(app.directives, [vec!["balance", "roundrobin"]]);
        assert_eq!(
            app.servers[0],
            Server {
                name: "s1".into(),
                address: "10.0.0.1".into(),
                port: Some("8080".into()),
                weight: Some("10".into()),
                disabled: false,
                rest: vec!["check".into()],
            }
        );
        assert_eq!((app.servers[1].address.as_str(), app.servers[1].port.as_deref()), ("fd00::2", Some("80")));
        assert!(app.servers[1].disabled);
    }

    #[test]
    fn sections_cut_from_text_parse_as_the_whole_does() {
        let text = "# _version=3\nglobal\n    maxconn 100\n\n  backend app # indented\n    server s1 \
                    10.0.0.1:80\nbackend#comment\n\"backend\" x\r\nfrontend f\n    bind :80";
        let cut = split_sections(text);
        assert_eq!(cut.preamble, "# _version=3\n");
        let whole = parse(text);
        let sections: Vec<Section> = cut.sections.iter().map(SectionText::parse).collect();
        assert_eq!(sections, whole.sections);
        assert_eq!(cut.sections.iter().map(|s| s.text).collect::<String>(), &text[cut.preamble.len()..]);
        assert_eq!(cut.sections[2].kind(), "backend");
        for section in &cut.sections {
            assert_eq!(section.header(), section.parse().header);
        }
    }

    /// Every keyword opens a section however indented, and no other line does, even one
    /// starting with a keyword's letter.
    #[test]
    fn every_section_keyword_is_found_and_nothing_else() {
        let mut text = String::from(
            "    server s 10.0.0.1:80
",
        );
        for (at, keyword) in SECTION_KEYWORDS.iter().enumerate() {
            text.push_str(&format!(
                "{}{keyword} s{at}
    balance roundrobin
    server s1 10.0.0.1:80
",
                " ".repeat(at % 3)
            ));
        }
        let cut = split_sections(&text);
        let kinds: Vec<&str> = cut.sections.iter().map(SectionText::kind).collect();
        assert_eq!(kinds, SECTION_KEYWORDS);
        assert_eq!(cut.preamble, "    server s 10.0.0.1:80\n");
    }

    /// Sections match by header words, however the header line is spaced or commented.
    #[test]
    fn headers_match_by_their_words() {
        let spaced = split_sections("backend   app  # the app\n");
        let plain = split_sections("backend app\n");
        let other = split_sections("backend api\n");
        assert!(spaced.sections[0].same_header(&plain.sections[0]));
        assert!(plain.sections[0].same_header(&plain.sections[0]));
        assert!(!plain.sections[0].same_header(&other.sections[0]));
        assert_eq!(spaced.sections[0].header(), ["backend", "app"]);
    }
}
