use super::*;

fn hp(s: &str) -> HostPort {
    HostPort::parse(s).unwrap()
}

fn kinds(text: &str) -> Vec<(Option<usize>, ProblemKind)> {
    match EndpointMap::parse("m", text.as_bytes()) {
        Ok(_) => Vec::new(),
        Err(p) => p.into_iter().map(|p| (p.line, p.kind)).collect(),
    }
}

fn addr_err(s: &str) -> AddrError {
    HostPort::parse(s).unwrap_err()
}

#[test]
fn addresses() {
    assert_eq!(
        hp("127.0.0.1:3333").host(),
        &Host::V4([127, 0, 0, 1].into())
    );
    assert_eq!(hp("[::1]:5555").host(), &Host::V6(Ipv6Addr::LOCALHOST));
    assert_eq!(hp("[::1]:5555").to_string(), "[::1]:5555");
    assert_eq!(
        hp("PS-0.Train.svc:65535").to_string(),
        "ps-0.train.svc:65535"
    );
    assert_eq!(hp("ps-0.train.svc.:1").port(), 1);
    assert_eq!(hp("localhost:00080").port(), 80);
    assert_eq!(hp("[0::1]:1"), hp("[::1]:1"));
    assert_eq!(hp("my_host:1").to_string(), "my_host:1");
}

#[test]
fn address_errors() {
    assert_eq!(addr_err(""), AddrError::Empty);
    assert_eq!(addr_err("host"), AddrError::MissingPort);
    assert_eq!(addr_err("host:"), AddrError::MissingPort);
    assert_eq!(addr_err(":80"), AddrError::MissingHost);
    assert_eq!(addr_err("host:0"), AddrError::PortZero);
    assert_eq!(addr_err("host:000"), AddrError::PortZero);
    assert_eq!(addr_err("host:65536"), AddrError::PortRange);
    assert_eq!(addr_err("host:99999999999999999999"), AddrError::PortRange);
    assert_eq!(addr_err("host:-1"), AddrError::BadPort);
    assert_eq!(addr_err("host:+1"), AddrError::BadPort);
    assert_eq!(addr_err("host:8o"), AddrError::BadPort);
    assert_eq!(addr_err("host: 80"), AddrError::BadPort);
    assert_eq!(addr_err("::1:80"), AddrError::UnbracketedIpv6);
    assert_eq!(addr_err("[::1:80"), AddrError::UnclosedBracket);
    assert_eq!(addr_err("[::1]"), AddrError::MissingPort);
    assert_eq!(addr_err("[::1]80"), AddrError::AfterBracket);
    assert_eq!(addr_err("[::g]:80"), AddrError::BadIpv6);
    assert_eq!(addr_err("[1.2.3.4]:80"), AddrError::BadIpv6);
    assert_eq!(addr_err("[fe80::1%eth0]:80"), AddrError::ZoneId);
    assert_eq!(addr_err("300.1.1.1:80"), AddrError::BadIpv4);
    assert_eq!(addr_err("1.2.3:80"), AddrError::BadIpv4);
    assert_eq!(addr_err("1.2.3.04:80"), AddrError::BadIpv4);
    assert_eq!(addr_err("a..b:80"), AddrError::EmptyLabel);
    assert_eq!(addr_err(".a:80"), AddrError::EmptyLabel);
    assert_eq!(addr_err("-a:80"), AddrError::HyphenEdge);
    assert_eq!(addr_err("a-.b:80"), AddrError::HyphenEdge);
    assert_eq!(addr_err("a b:80"), AddrError::BadChar(' '));
    assert_eq!(addr_err("fe80::1"), AddrError::UnbracketedIpv6);
    assert_eq!(addr_err("http://a:80"), AddrError::BadChar(':'));
    assert_eq!(addr_err("a:b:80"), AddrError::BadChar(':'));
    assert_eq!(addr_err("a/b:80"), AddrError::BadChar('/'));
    assert_eq!(addr_err("ä:80"), AddrError::BadChar('ä'));
    let long_label = format!("{}:80", "a".repeat(64));
    assert_eq!(addr_err(&long_label), AddrError::LabelTooLong);
    let long_name = format!("{}:80", ["a"; 130].join("."));
    assert_eq!(addr_err(&long_name), AddrError::NameTooLong);
}

#[test]
fn valid_map_with_comments_and_blank_lines() {
    let text = "\
# the cluster of job 7\r
\r
127.0.0.1:3333=127.0.0.1:5555\r
   [::1]:3333 = [::1]:5555   # ps 1
\t# indented comment
ps-2.svc:3333=ps-2.svc:5555#not-a-comment-but-fine?
";
    // The last line has '#' glued to the port: that is a malformed port.
    let problems = kinds(text);
    assert_eq!(problems.len(), 1);
    assert!(matches!(
        problems[0],
        (
            Some(6),
            ProblemKind::BadAddress {
                side: AddrKind::Data,
                error: AddrError::BadPort,
                ..
            }
        )
    ));
    let text = text.replace("#not-a-comment-but-fine?", " # fine");
    let map = EndpointMap::parse("m", text.as_bytes()).unwrap();
    assert_eq!(map.len(), 3);
    assert_eq!(map.entries()[1].line, 4);
    assert_eq!(map.data_addr(&hp("[::1]:3333")), Some(&hp("[::1]:5555")));
    assert_eq!(
        map.data_addr(&hp("PS-2.svc:3333")),
        Some(&hp("ps-2.svc:5555"))
    );
    assert_eq!(map.data_addr(&hp("ps-2.svc:5555")), None);
    // Display gives the file form back, which parses to the same entries.
    let again = EndpointMap::parse("m", map.to_string().as_bytes()).unwrap();
    let pairs = |m: &EndpointMap| {
        m.entries()
            .iter()
            .map(|e| (e.control.clone(), e.data.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&again), pairs(&map));
}

#[test]
fn empty_map_is_valid() {
    assert!(EndpointMap::parse("m", b"").unwrap().is_empty());
    assert!(EndpointMap::parse("m", b"\n# nothing\n\n")
        .unwrap()
        .is_empty());
}

#[test]
fn every_invalid_kind_with_its_line() {
    let text = "\
127.0.0.1:3333=127.0.0.1:5555
127.0.0.1:3333
127.0.0.1:4444=127.0.0.1:0
127.0.0.1:4444=127.0.0.1:70000
127.0.0.1:3333=127.0.0.1:7777
127.0.0.1:8888=127.0.0.1:5555
127.0.0.1:9999=127.0.0.1:3333
127.0.0.1:1111=127.0.0.1:1112 extra
127.0.0.1:2222=127.0.0.1:2223=127.0.0.1:2224
bad host:1=127.0.0.1:2
0.0.0.0:5=127.0.0.1:6
=127.0.0.1:7
127.0.0.1:8=
";
    let p = kinds(text);
    let lines: Vec<_> = p.iter().map(|(l, _)| l.unwrap()).collect();
    assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    assert!(matches!(p[0].1, ProblemKind::MissingSeparator { .. }));
    assert!(matches!(
        p[1].1,
        ProblemKind::BadAddress {
            side: AddrKind::Data,
            error: AddrError::PortZero,
            ..
        }
    ));
    assert!(matches!(
        p[2].1,
        ProblemKind::BadAddress {
            side: AddrKind::Data,
            error: AddrError::PortRange,
            ..
        }
    ));
    assert!(matches!(
        p[3].1,
        ProblemKind::DuplicateControl { first_line: 1, .. }
    ));
    assert!(matches!(
        p[4].1,
        ProblemKind::SharedData { other_line: 1, .. }
    ));
    assert!(matches!(
        p[5].1,
        ProblemKind::DataIsControl {
            control_line: 1,
            ..
        }
    ));
    assert_eq!(
        p[6].1,
        ProblemKind::TrailingText {
            text: "extra".into()
        }
    );
    assert_eq!(
        p[7].1,
        ProblemKind::TrailingText {
            text: "=127.0.0.1:2224".into()
        }
    );
    assert!(matches!(
        p[8].1,
        ProblemKind::BadAddress {
            side: AddrKind::Control,
            error: AddrError::BadChar(' '),
            ..
        }
    ));
    assert!(matches!(
        p[9].1,
        ProblemKind::Unspecified {
            side: AddrKind::Control,
            ..
        }
    ));
    assert!(matches!(
        p[10].1,
        ProblemKind::BadAddress {
            side: AddrKind::Control,
            error: AddrError::Empty,
            ..
        }
    ));
    assert!(matches!(
        p[11].1,
        ProblemKind::BadAddress {
            side: AddrKind::Data,
            error: AddrError::Empty,
            ..
        }
    ));
}

#[test]
fn data_equal_to_a_later_control_and_to_its_own() {
    let p = kinds("a:1=b:2\nb:2=c:3\nd:4=d:4\n");
    assert_eq!(p.len(), 2);
    assert_eq!(
        p[0],
        (
            Some(1),
            ProblemKind::DataIsControl {
                data: hp("b:2"),
                control_line: 2
            }
        )
    );
    assert_eq!(
        p[1],
        (
            Some(3),
            ProblemKind::DataIsControl {
                data: hp("d:4"),
                control_line: 3
            }
        )
    );
    let (map, _) = EndpointMap::parse_lenient("m", b"a:1=b:2\nb:2=c:3\nd:4=d:4\n");
    assert_eq!(map.len(), 1);
    assert_eq!(map.data_addr(&hp("b:2")), Some(&hp("c:3")));
}

#[test]
fn messages_name_file_line_and_problem() {
    let p = EndpointMap::parse(
        "/etc/job/.endpoint_map",
        b"h:1=h:2\nh:1=h:3\nh:4=h:2\nh:5=[::1]:99999\n",
    )
    .unwrap_err();
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        text,
        [
            "/etc/job/.endpoint_map:2: control address h:1 is already mapped on line 1",
            "/etc/job/.endpoint_map:3: data address h:2 is already used by h:1 (line 1)",
            "/etc/job/.endpoint_map:4: data address \"[::1]:99999\": port out of range (1-65535)",
        ]
    );
}

#[test]
fn limits_and_bad_bytes() {
    let p = kinds(&format!("a:1=b:{}\n", "2".repeat(MAX_LINE_BYTES)));
    assert_eq!(p, [(Some(1), ProblemKind::LineTooLong)]);
    let p = EndpointMap::parse("m", b"a:1=b:2\n\xff:1=b:3\n").unwrap_err();
    assert_eq!(p[0].line, Some(2));
    assert_eq!(p[0].kind, ProblemKind::NotUtf8);
    let big = vec![b'#'; MAX_FILE_BYTES + 1];
    let p = EndpointMap::parse("m", &big).unwrap_err();
    assert_eq!(p[0].line, None);
    assert!(matches!(p[0].kind, ProblemKind::TooLarge { .. }));
    let long = format!("{}=b:1", "x".repeat(200));
    let p = EndpointMap::parse("m", long.as_bytes()).unwrap_err();
    assert!(p[0]
        .to_string()
        .ends_with("...: no port; expected host:port"));
}

#[test]
fn locate() {
    let none = |_: &str| None;
    assert_eq!(
        EndpointMap::locate_with(None, none),
        PathBuf::from(".endpoint_map")
    );
    let env = |name: &str| (name == ENV_PATH).then(|| OsString::from("/job/conf"));
    assert_eq!(
        EndpointMap::locate_with(None, env),
        PathBuf::from("/job/conf/.endpoint_map")
    );
    let empty = |_: &str| Some(OsString::new());
    assert_eq!(
        EndpointMap::locate_with(None, empty),
        PathBuf::from(".endpoint_map")
    );
    let file = Path::new("/no/such/dir/map.txt");
    assert_eq!(EndpointMap::locate_with(Some(file), env), file);
    let dir = std::env::temp_dir();
    assert_eq!(
        EndpointMap::locate_with(Some(&dir), env),
        dir.join(".endpoint_map")
    );
}

#[test]
fn load_reports_io_errors_with_the_path() {
    let e = EndpointMap::load(Path::new("/no/such/file")).unwrap_err();
    assert!(e.to_string().starts_with("/no/such/file: "), "{e}");
    // A path given by the caller: nothing to add.
    assert!(!e.to_string().contains(ENV_PATH), "{e}");
    // Found through the variable: said so; what `?` in main prints is the same message.
    let env = |name: &str| (name == ENV_PATH).then(|| OsString::from("/no/such/dir"));
    let e = EndpointMap::locate_and_load(None, env).unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("/no/such/dir/.endpoint_map: "), "{text}");
    assert!(
        text.ends_with(" (the endpoint map, found through TF_SEASTAR_ENDPOINT_MAP_PATH)"),
        "{text}"
    );
    assert_eq!(format!("{e:?}"), text);
    // Looked for in the current folder: how to point at it.
    let e = LoadError::Io {
        path: PathBuf::from(FILE_NAME),
        error: std::io::Error::from(std::io::ErrorKind::NotFound),
        found: Found::CurrentFolder,
    };
    assert!(format!("{e:?}").starts_with(".endpoint_map: "), "{e:?}");
    assert!(
        format!("{e:?}").ends_with(
            "(the endpoint map, looked for in the current folder: give its path, or set \
             TF_SEASTAR_ENDPOINT_MAP_PATH to its folder)"
        ),
        "{e:?}"
    );
}

#[test]
fn a_line_left_out_is_found_by_its_control_address() {
    let text = b"10.0.0.1:2222=10.0.0.1:5555\n\
        10.0.0.2:2222=10.0.0.1:5555\n\
        10.0.0.3:2222=10.0.0.3:0\n\
        10.0.0.4:2222=0.0.0.0:5555\n\
        10.0.0.5:2222=10.0.0.1:2222\n\
        10.0.0.1:2222=10.0.0.9:5555\n";
    let (map, problems) = EndpointMap::parse_lenient("m", text);
    assert_eq!(problems.len(), 5, "{problems:?}");
    assert_eq!(map.len(), 1);
    // Each left out for a problem of its own, reported on its line.
    for (control, line) in [
        ("10.0.0.2:2222", 2),
        ("10.0.0.3:2222", 3),
        ("10.0.0.4:2222", 4),
        ("10.0.0.5:2222", 5),
    ] {
        assert_eq!(map.rejected_line(&hp(control)), Some(line), "{control}");
        assert!(problems.iter().any(|p| p.line == Some(line)));
    }
    // A control address with an entry (a later duplicate line is its problem alone), and
    // one named nowhere.
    assert_eq!(map.rejected_line(&hp("10.0.0.1:2222")), None);
    assert_eq!(map.rejected_line(&hp("10.0.0.8:2222")), None);
}
