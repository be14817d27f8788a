use super::*;

fn parse(s: &str) -> FaultRule {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn parses_the_documented_examples() {
    assert_eq!(
        parse("phase=dot,action=drop,times=1,key=abc"),
        FaultRule::drop_after_dot().with_times(1).with_key("abc")
    );
    assert_eq!(
        parse("phase=rcpt,action=reply,code=451,text=try later"),
        FaultRule::reply(FaultStage::Rcpt, 451, "try later")
    );
    assert_eq!(
        parse("phase=dot,action=delay,ms=5000"),
        FaultRule::delay(FaultStage::Dot, Duration::from_millis(5000))
    );
    assert_eq!(
        parse("action=disconnect, phase=MAIL"),
        FaultRule::disconnect(FaultStage::Mail)
    );
    // drop defaults to the only phase it has.
    assert_eq!(parse("action=drop"), FaultRule::drop_after_dot());
}

#[test]
fn text_takes_the_rest_including_commas() {
    let rule = parse("phase=dot,action=reply,code=550,text=5.7.1 no, really, no");
    assert_eq!(
        rule.action,
        FaultAction::Reply {
            phase: FaultStage::Dot,
            code: 550,
            text: "5.7.1 no, really, no".into()
        }
    );
}

#[test]
fn default_reply_text_carries_an_enhanced_code() {
    let rule = parse("phase=connect,action=reply,code=421");
    assert_eq!(
        rule.action,
        FaultAction::Reply {
            phase: FaultStage::Connect,
            code: 421,
            text: "4.0.0 sink fault at connect".into()
        }
    );
}

#[test]
fn refuses_rules_that_cannot_fire_or_make_no_sense() {
    for bad in [
        "",
        "phase=dot",
        "phase=dot,action=explode",
        "phase=rcpt,action=drop",
        "phase=dot,action=reply",
        "phase=dot,action=reply,code=250",
        "phase=dot,action=reply,code=99999",
        "action=reply,code=451",
        "phase=dot,action=delay",
        "phase=dot,action=delay,ms=soon",
        "phase=rcpt,action=reply,code=451,key=abc",
        "phase=mail,action=disconnect,rcpt=a@b",
        "phase=dot,action=drop,times=0",
        "phase=dot,action=drop,code=451",
        "phase=dot,action=drop,colour=red",
        "phase=dot,phase=rcpt,action=drop",
        "phase=dot action=drop",
    ] {
        assert!(bad.parse::<FaultRule>().is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn display_round_trips() {
    for s in [
        "phase=dot,action=drop,times=1,key=abc",
        "phase=rcpt,action=reply,code=451,rcpt=@slow.example,text=4.3.0 try, later",
        "phase=ehlo,action=delay,ms=250",
        "phase=data,action=disconnect,times=3",
    ] {
        let rule = parse(s);
        assert_eq!(rule.to_string(), s);
        assert_eq!(parse(&rule.to_string()), rule);
    }
}

#[test]
fn json_form_matches_the_cli_form() {
    let json = r#"[{"phase":"dot","action":"drop","times":1,"key":"abc"},
                       {"phase":"rcpt","action":"reply","code":451,"text":"try later"},
                       {"phase":"dot","action":"delay","ms":5000}]"#;
    let rules: Vec<FaultRule> = serde_json::from_str(json).unwrap();
    assert_eq!(
        rules,
        vec![
            parse("phase=dot,action=drop,times=1,key=abc"),
            parse("phase=rcpt,action=reply,code=451,text=try later"),
            parse("phase=dot,action=delay,ms=5000"),
        ]
    );
    let back: Vec<FaultRule> =
        serde_json::from_str(&serde_json::to_string(&rules).unwrap()).unwrap();
    assert_eq!(back, rules);
    assert!(serde_json::from_str::<FaultRule>(r#"{"action":"drop","nope":1}"#).is_err());
    assert!(serde_json::from_str::<FaultRule>(r#"{"phase":"rcpt","action":"drop"}"#).is_err());
}

#[test]
fn first_matching_unspent_rule_fires() {
    let mut set = FaultSet::new(vec![
        parse("phase=dot,action=drop,times=1,key=k1"),
        parse("phase=dot,action=reply,code=451,times=2"),
        parse("phase=rcpt,action=reply,code=550,rcpt=BAD@"),
    ])
    .unwrap();
    let k1 = Context {
        key: Some("order-k1"),
        ..Context::default()
    };
    let k2 = Context {
        key: Some("order-k2"),
        ..Context::default()
    };
    let action = |r: Option<FaultRule>| r.map(|r| r.action.name());
    assert_eq!(action(set.fire(FaultStage::Dot, &k2)), Some("reply"));
    assert_eq!(action(set.fire(FaultStage::Dot, &k1)), Some("drop"));
    assert_eq!(action(set.fire(FaultStage::Dot, &k1)), Some("reply"));
    // Both spent now.
    assert_eq!(action(set.fire(FaultStage::Dot, &k1)), None);
    assert_eq!(action(set.fire(FaultStage::Mail, &k1)), None);

    let good = ["good@example.com".to_string()];
    let bad = ["bad@example.com".to_string()];
    let ctx = |rcpts| Context {
        rcpts,
        ..Context::default()
    };
    assert_eq!(action(set.fire(FaultStage::Rcpt, &ctx(&good))), None);
    assert_eq!(
        action(set.fire(FaultStage::Rcpt, &ctx(&bad))),
        Some("reply")
    );
    assert_eq!(
        action(set.fire(FaultStage::Rcpt, &ctx(&bad))),
        Some("reply")
    );
    let fired: Vec<u32> = set.status().iter().map(|s| s.fired).collect();
    assert_eq!(fired, vec![1, 2, 2]);
}

#[test]
fn webhook_rules_parse_and_only_exist_at_phase_webhook() {
    assert_eq!(
        parse("phase=webhook,action=duplicate,times=2,key=k"),
        FaultRule::webhook(WebhookFault::Duplicate)
            .with_times(2)
            .with_key("k")
    );
    assert_eq!(
        parse("action=late,ms=1500"),
        FaultRule::webhook(WebhookFault::Late(Duration::from_millis(1500)))
    );
    assert_eq!(
        parse("action=reorder,rcpt=@slow"),
        FaultRule::webhook(WebhookFault::Reorder).with_rcpt("@slow")
    );
    assert_eq!(
        parse("phase=webhook,action=lose_ack"),
        FaultRule::webhook(WebhookFault::LoseAck)
    );
    for s in [
        "phase=webhook,action=duplicate,times=1,key=abc",
        "phase=webhook,action=late,ms=300",
        "phase=webhook,action=lose_ack,rcpt=x@y",
    ] {
        assert_eq!(parse(s).to_string(), s);
    }
    for bad in [
        "phase=dot,action=duplicate",
        "phase=webhook,action=drop",
        "phase=webhook,action=reply,code=451",
        "phase=webhook,action=delay,ms=5",
        "phase=webhook,action=disconnect",
        "action=late",
        "action=duplicate,ms=5",
        "action=reorder,code=500",
    ] {
        assert!(bad.parse::<FaultRule>().is_err(), "{bad:?} was accepted");
    }
    let json: FaultRule =
        serde_json::from_str(r#"{"phase":"webhook","action":"late","ms":20}"#).unwrap();
    assert_eq!(json, parse("action=late,ms=20"));
}

#[test]
fn reorder_fires_on_injection_batches_only() {
    let mut set = FaultSet::new(vec![
        parse("action=reorder,times=1"),
        parse("action=duplicate,key=k2"),
    ])
    .unwrap();
    let batch = |key, event| Context {
        key: Some(key),
        rcpts: &[],
        event: Some(event),
    };
    let action = |r: Option<FaultRule>| r.map(|r| r.action.name());
    assert_eq!(
        action(set.fire(FaultStage::Webhook, &batch("k1", "delivery"))),
        None
    );
    assert_eq!(
        action(set.fire(FaultStage::Webhook, &batch("k2", "delivery"))),
        Some("duplicate")
    );
    assert_eq!(
        action(set.fire(FaultStage::Webhook, &batch("k1", "injection"))),
        Some("reorder")
    );
    assert_eq!(
        action(set.fire(FaultStage::Webhook, &batch("k1", "injection"))),
        None
    );
    // SMTP phases never see webhook rules.
    assert_eq!(
        action(set.fire(FaultStage::Dot, &batch("k2", "injection"))),
        None
    );
}

#[test]
fn a_key_rule_does_not_fire_for_a_message_without_key() {
    let mut set = FaultSet::new(vec![parse("phase=dot,action=drop,key=abc")]).unwrap();
    assert!(set.fire(FaultStage::Dot, &Context::default()).is_none());
}
