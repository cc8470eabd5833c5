//! Which stored object a template touched last, and which one a refused value came from: so a
//! render error names the object and field, and the controller can leave that object out.

use super::*;

thread_local! {
    /// The stored object a template touched last, named in render errors. Renders are
    /// synchronous on one thread, so a thread-local follows exactly one render.
    pub(super) static LAST_OBJECT: RefCell<Option<Arc<TrackedObject>>> = const { RefCell::new(None) };
    /// The object whose value was refused, and the field that held it, so the controller can
    /// leave the object out and retry, and say where the value was without quoting it.
    pub(super) static OFFENDER: RefCell<Option<Offender>> = const { RefCell::new(None) };
}

/// An object blamed for a refused value.
#[derive(Clone, Debug)]
pub(crate) struct Offender {
    /// The object.
    pub(crate) object: ObjectRef,
    /// The field holding the value (`spec.rules[0].host`), when the value is one of the
    /// object's own rather than computed from them.
    pub(crate) field: Option<String>,
}

/// Forgets what the previous render touched.
pub(crate) fn reset_tracking() {
    LAST_OBJECT.with(|last| last.borrow_mut().take());
    OFFENDER.with(|offender| offender.borrow_mut().take());
}

/// The object a template touched last.
pub(crate) fn last_object() -> Option<ObjectRef> {
    LAST_OBJECT.with(|last| last.borrow().as_ref().map(|tracked| tracked.reference.as_ref().clone()))
}

/// Blames the object touched last for a refused value, naming the field that holds it.
pub(crate) fn blame_value(value: &str) {
    let Some(last) = LAST_OBJECT.with(|last| last.borrow().clone()) else { return };
    let field = field_holding(&last.inner, value);
    let offender = Offender { object: last.reference.as_ref().clone(), field };
    OFFENDER.with(|blamed| *blamed.borrow_mut() = Some(offender));
}

/// Blames the object touched last for a refused value in a field known by name (a value
/// that is not a string, such as a Secret's data).
pub(crate) fn blame_field(field: &str) {
    let Some(object) = last_object() else { return };
    let offender = Offender { object, field: Some(field.to_owned()) };
    OFFENDER.with(|blamed| *blamed.borrow_mut() = Some(offender));
}

/// Blames `object` itself (not the one touched last) for its `field`.
pub(crate) fn blame_object_field(object: &Value, field: &str) {
    // Touching the object makes it the one touched last.
    let _ = object.get_attr("metadata");
    blame_field(field);
}

/// `refuse(object, field, message)`: refuses `object` (its `field` blamed) with the library's
/// own message, for what no filter sees: a Secret an annotation names that does not exist.
pub(crate) fn refuse(object: &Value, field: &str, message: &str) -> Error {
    blame_object_field(object, field);
    let message: String = message.chars().filter(|c| !c.is_control()).collect();
    Error::new(ErrorKind::InvalidOperation, message)
}

/// The object blamed for a refused value during this render.
pub(crate) fn offender() -> Option<Offender> {
    OFFENDER.with(|offender| offender.borrow().clone())
}

/// The path of the field of `object` that holds `needle` (or, failing that, that holds it as
/// part of its text, or is part of it), e.g. `spec.rules[0].host`, `metadata.annotations
/// ["haptic.dev/timeout-server"]`. Searched only when a value is refused.
pub(super) fn field_holding(object: &Value, needle: &str) -> Option<String> {
    let exact = |leaf: &str| leaf == needle;
    let partial = |leaf: &str| leaf.len() >= 3 && (leaf.contains(needle) || needle.contains(leaf));
    let mut path = String::new();
    if walk(object, &exact, &mut path, 0) || (!needle.is_empty() && walk(object, &partial, &mut path, 0)) {
        Some(path)
    } else {
        None
    }
}

/// The path of the field of `object`'s `spec` or annotations holding one of `needles` (tried
/// in order, each exactly before any in part), for a value HAProxy quoted in a refusal. Names
/// and namespaces are left out of the search: a file named after them is no field of theirs.
pub(crate) fn field_holding_any(object: &Value, needles: &[String]) -> Option<String> {
    let roots = [("spec", vec!["spec"]), ("metadata.annotations", vec!["metadata", "annotations"])];
    let roots: Vec<(&str, Value)> = roots
        .iter()
        .filter_map(|(name, path)| {
            let mut value = object.clone();
            for key in path {
                value = value.get_attr(key).ok().filter(|v| !v.is_undefined() && !v.is_none())?;
            }
            Some((*name, value))
        })
        .collect();
    for exact in [true, false] {
        for needle in needles.iter().filter(|n| !n.is_empty()) {
            let matches = |leaf: &str| {
                // In part: the field holds the quoted value among more (a rewrite's regex and
                // its replacement), never the other way round (a short field inside a long message).
                if exact { leaf == needle } else { leaf.contains(needle.as_str()) }
            };
            for (name, root) in &roots {
                let mut path = String::new();
                if walk(root, &matches, &mut path, 0) {
                    let separator = if path.starts_with('[') { "" } else { "." };
                    return Some(format!("{name}{separator}{path}"));
                }
            }
        }
    }
    None
}

pub(super) fn walk(value: &Value, matches: &dyn Fn(&str) -> bool, path: &mut String, depth: usize) -> bool {
    use minijinja::value::ValueKind;
    if depth > 32 {
        return false;
    }
    let before = path.len();
    match value.kind() {
        ValueKind::String => value.as_str().is_some_and(matches),
        ValueKind::Seq => {
            let Ok(items) = value.try_iter() else { return false };
            for (index, item) in items.enumerate() {
                path.push_str(&format!("[{index}]"));
                if walk(&item, matches, path, depth + 1) {
                    return true;
                }
                path.truncate(before);
            }
            false
        }
        ValueKind::Map => {
            let Ok(keys) = value.try_iter() else { return false };
            for key in keys {
                let Ok(item) = value.get_item(&key) else { continue };
                let name = key.as_str().unwrap_or("?");
                // Keys are the cluster's too (the API server restricts them): written as they
                // stand only when plainly inert.
                let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                let inert = name.chars().all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c));
                match (plain, inert) {
                    (true, _) if before == 0 => path.push_str(name),
                    (true, _) => {
                        path.push('.');
                        path.push_str(name);
                    }
                    (false, true) => path.push_str(&format!("[{name:?}]")),
                    (false, false) => path.push_str("[?]"),
                }
                if walk(&item, matches, path, depth + 1) {
                    return true;
                }
                path.truncate(before);
            }
            false
        }
        _ => false,
    }
}
