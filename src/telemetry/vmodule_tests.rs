use super::*;

fn item(pattern: &str, level: u32) -> VModuleItem {
    VModuleItem {
        pattern: pattern.into(),
        level,
    }
}

#[test]
fn parses_as_component_base_with_its_errors() {
    assert_eq!(
        parse_vmodule("controller=5,,http*=2,").unwrap(),
        VModuleList(vec![item("controller", 5), item("http*", 2)])
    );
    assert_eq!(parse_vmodule("").unwrap(), VModuleList::default());
    for (bad, error) in [
        ("foo", r#""foo" does not have the pattern=N format"#),
        ("=1", r#""=1" does not have the pattern=N format"#),
        ("a=1=2", r#""a=1=2" does not have the pattern=N format"#),
        ("foo=", r#""foo=" does not have the pattern=N format"#),
        (
            "foo=x",
            r#"parsing verbosity in "foo=x": strconv.ParseUint: parsing "x": invalid syntax"#,
        ),
        (
            "foo=99999999999",
            r#"parsing verbosity in "foo=99999999999": strconv.ParseUint: parsing "99999999999": value out of range"#,
        ),
        (
            "foo=2147483648",
            r#"parsing verbosity in "foo=2147483648": strconv.ParseUint: parsing "2147483648": value out of range"#,
        ),
    ] {
        assert_eq!(parse_vmodule(bad).unwrap_err(), error, "{bad}");
    }
    assert_eq!(
        parse_vmodule("a=2147483647").unwrap().0[0].level,
        2147483647
    );
}

#[test]
fn literal_and_glob_patterns_match_base_names() {
    for (pattern, name, expected) in [
        ("controller", "controller", true),
        ("control", "controller", false),
        ("contr*", "controller", true),
        ("*ler", "controller", true),
        ("c?ntroller", "controller", true),
        ("c[a-o]ntroller", "controller", true),
        ("c[^o]ntroller", "controller", false),
        ("c[!o]ntroller", "controller", true),
        ("[ab]*", "controller", false),
        ("\\controller", "controller", true),
        ("c[\\o]ntroller", "controller", true),
        ("*", "anything", true),
        ("c[", "c", false),
        ("[]a]", "a", false),
        ("[a-]", "a", false),
    ] {
        assert_eq!(matches(pattern, name), expected, "{pattern} vs {name}");
    }
}

/// Found by `a_glob_answers_quickly_whatever_its_stars`: each `*` retried every split below
/// it, so ten stars against a 40-character name did not finish.
#[test]
fn many_stars_match_in_polynomial_time() {
    let name = "a".repeat(40);
    let started = std::time::Instant::now();
    assert!(!matches("*a*a*a*a*a*a*a*a*a*a*b", &name));
    assert!(matches("*a*a*a*a*a*a*a*a*a*a*", &name));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

#[test]
fn first_matching_item_decides_from_file_or_module() {
    let items = [item("http", 3), item("h*", 7), item("controller", 5)];
    assert_eq!(level_for(&items, Some("src/http.rs"), None), Some(3));
    assert_eq!(level_for(&items, Some("src/health.rs"), None), Some(7));
    assert_eq!(
        level_for(&items, None, Some("csi_provisioner::provision::controller")),
        Some(5)
    );
    assert_eq!(
        level_for(
            &items,
            Some("src/provision/plan.rs"),
            Some("csi_provisioner::provision::plan")
        ),
        None
    );
    assert_eq!(
        level_for(&items, Some("src/a/b.rs"), Some("csi_provisioner::http")),
        Some(3),
        "a module declared from another file still matches by its name"
    );
}
