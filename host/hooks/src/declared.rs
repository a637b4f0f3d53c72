//! The kinds a component declares it implements. The Plexus SDK exports all three hook interfaces (the kinds a
//! hook does not implement as pass-throughs), so exports alone cannot tell a policy-only hook from one that
//! also resolves and shapes status. `plexus_sdk::export!` therefore also writes the kinds it was given into a
//! custom section of the core module, [`KINDS_SECTION`], which the host reads when it compiles the component and
//! keeps in the compiled artifact. A component without the section (written against the WIT directly, or built
//! by an SDK before this one) serves the kinds it exports, as before.

use crate::spec::HookKind;

/// The custom section's name; its content is the kinds' names, separated by commas.
pub const KINDS_SECTION: &str = "plexus:hooks/kinds";

/// The kinds a component declares, or that it declares none. Stored in the compiled artifact as one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Declared(u8);

const HAS_DECLARATION: u8 = 0x80;

fn bit(kind: HookKind) -> u8 {
    match kind {
        HookKind::Policy => 1,
        HookKind::Resolver => 2,
        HookKind::Status => 4,
    }
}

impl Declared {
    /// No declaration: every exported kind is served.
    pub const NONE: Declared = Declared(0);

    pub fn of(kinds: &[HookKind]) -> Declared {
        Declared(kinds.iter().fold(HAS_DECLARATION, |b, k| b | bit(*k)))
    }

    /// The declared kinds, `None` without a declaration.
    pub fn kinds(self) -> Option<Vec<HookKind>> {
        (self.0 & HAS_DECLARATION != 0).then(|| {
            HookKind::ALL
                .into_iter()
                .filter(|k| self.0 & bit(*k) != 0)
                .collect()
        })
    }

    /// Whether a hook of `kind` may run this component: declared, or nothing declared.
    pub fn allows(self, kind: HookKind) -> bool {
        self.0 & HAS_DECLARATION == 0 || self.0 & bit(kind) != 0
    }

    pub(crate) fn to_byte(self) -> u8 {
        self.0
    }

    pub(crate) fn from_byte(b: u8) -> Declared {
        Declared(b)
    }
}

/// `policy, status`, or `no kind` for an empty list.
pub fn names(kinds: &[HookKind]) -> String {
    if kinds.is_empty() {
        return "no kind".into();
    }
    kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads the declaration from a component's (or core module's) bytes, nested modules included. Names this host
/// does not know are skipped (a kind of a later contract); several sections add up.
pub fn read(wasm: &[u8]) -> Result<Declared, String> {
    use wasmtime::wasmparser::{Parser, Payload};
    let mut kinds: Option<Vec<HookKind>> = None;
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| format!("cannot read the component: {e}"))?;
        let Payload::CustomSection(section) = payload else {
            continue;
        };
        if section.name() != KINDS_SECTION {
            continue;
        }
        let text = std::str::from_utf8(section.data())
            .map_err(|_| format!("its {KINDS_SECTION} section is not UTF-8"))?;
        let found = kinds.get_or_insert_with(Vec::new);
        found.extend(
            text.split(|c: char| c == ',' || c.is_whitespace())
                .filter_map(|name| name.parse::<HookKind>().ok()),
        );
    }
    Ok(kinds.map_or(Declared::NONE, |k| Declared::of(&k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module holding only custom sections `(name, data)`.
    fn module(sections: &[(&str, &str)]) -> Vec<u8> {
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        for (name, data) in sections {
            let mut body = vec![name.len() as u8];
            body.extend_from_slice(name.as_bytes());
            body.extend_from_slice(data.as_bytes());
            m.push(0);
            m.push(body.len() as u8);
            m.extend(body);
        }
        m
    }

    #[test]
    fn reads_the_declared_kinds() {
        let d = read(&module(&[(KINDS_SECTION, "policy")])).unwrap();
        assert_eq!(d.kinds(), Some(vec![HookKind::Policy]));
        assert!(d.allows(HookKind::Policy));
        assert!(!d.allows(HookKind::Resolver));
        assert!(!d.allows(HookKind::Status));

        let d = read(&module(&[
            ("producers", "x"),
            (KINDS_SECTION, "status, policy"),
        ]))
        .unwrap();
        assert_eq!(d.kinds(), Some(vec![HookKind::Policy, HookKind::Status]));
        assert_eq!(Declared::from_byte(d.to_byte()), d);
    }

    #[test]
    fn no_section_allows_every_kind_and_unknown_names_none() {
        let none = read(&module(&[("producers", "x")])).unwrap();
        assert_eq!(none, Declared::NONE);
        assert_eq!(none.kinds(), None);
        assert!(HookKind::ALL.into_iter().all(|k| none.allows(k)));

        let later = read(&module(&[(KINDS_SECTION, "classifier")])).unwrap();
        assert_eq!(later.kinds(), Some(vec![]));
        assert!(HookKind::ALL.into_iter().all(|k| !later.allows(k)));
        assert!(
            read(b"\0asm\x01\0\0\0\0\x05").is_err(),
            "a truncated section"
        );
    }
}
